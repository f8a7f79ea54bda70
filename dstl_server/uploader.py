"""The upload engine: put one built object into the store (Flink ``RetryingExecutor``).

The scheduler hands an uploader the bytes of one object and the job it
belongs to; the uploader picks the key (a new one for every attempt, so
attempts never overwrite each other) and returns the key that won. An
uploader either returns the key of a complete object or raises; it never
returns a key whose object is incomplete.

:class:`UploadExecutor` is the one engine: retries, request hedging (a mode of
it, ``off`` included), one total deadline and the discard of losing attempts,
all on an injected clock. Its limits are an
:class:`~dstl_server.upload_policy.UploadPolicy`; the sidecar builds it with
:func:`dstl_server.hedging.make_uploader`.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from dstl_client.core.keys import new_object_key
from dstl_server.discards import Attempt, LoserDiscarder
from dstl_server.hedge_stats import HedgeBudget, LatencyTracker
from dstl_server.metrics import ServerMetrics, size_class
from dstl_server.storage.base import BlobStore
from dstl_server.upload_clock import Clock, Sleep, loop_time, wait_first, within
from dstl_server.upload_policy import (
    UploadPolicy,
    deadline_error,
    failure_kind,
    is_retryable,
    release_frames,
    upload_error,
)

__all__ = ["UploadExecutor", "UploadPolicy", "Uploader"]


class Uploader(abc.ABC):
    """Writes one object; returns its key. Called from the event loop."""

    @abc.abstractmethod
    async def upload(self, job_id: str, data: bytes) -> str:
        """Store ``data`` as a new object of ``job_id``; raise on final failure."""

    async def close(self, timeout_s: float = 30.0) -> None:  # noqa: B027 - optional hook
        """Finish background work (deleting losing attempts) within ``timeout_s``."""


@dataclass(slots=True)
class _Run:
    """The state of one upload: its attempts and what they did (its upload task only)."""

    job_id: str
    data: bytes
    live: dict[asyncio.Task[None], Attempt] = field(default_factory=dict)
    ended: list[Attempt] = field(default_factory=list)  # lost or failed, discarded at the end
    errors: list[BaseException] = field(default_factory=list)
    number: int = 0  # attempts started, hedge included
    tries: int = 0  # attempts counted against max_attempts
    hedge_asked: bool = False
    retry_at: float | None = None
    winner: Attempt | None = None

    def collect(self, done: Collection[asyncio.Future[Any]]) -> list[BaseException]:
        """Move the ``done`` attempts out of ``live``; the earliest success wins.

        Returns the errors of those that failed.
        """
        failed: list[BaseException] = []
        for task in [t for t in self.live if t in done]:
            att = self.live.pop(task)
            exc = task.exception()
            if exc is None and self.winner is None:
                self.winner = att
                continue
            self.ended.append(att)
            if exc is not None:
                self.errors.append(exc)
                failed.append(exc)
        return failed


class UploadExecutor(Uploader):
    """The one upload engine: retries, hedging, a total deadline, loser discards.

    The rules of one :meth:`upload`:

    * **Every attempt writes a new key** (``keys.new_object_key``); attempts
      never overwrite each other, so the first attempt to succeed simply wins.
    * **Hedging**: when the only running attempt has not finished after the
      hedge delay, a second attempt (the *hedge*) starts on a new key while the
      first goes on; at most one hedge per upload. The delay is, by
      ``hedge_mode``: ``adaptive``, the ``hedge_quantile`` of recent successful
      attempt latencies of the same size class (:class:`LatencyTracker`),
      clamped to ``[hedge_min_delay_s, hedge_max_delay_s]`` (the ceiling until
      enough samples exist); ``fixed``, ``hedge_delay_s``; ``off``, no hedge
      ever starts (everything else is the same). Hedges stay below
      ``hedge_budget_fraction`` of the uploads of the window
      (:class:`HedgeBudget`); a hedge the budget refuses is skipped, not queued.
    * **Retries**: an attempt failing with a retryable error
      (:func:`~dstl_server.upload_policy.is_retryable`: by type, per-attempt
      timeouts included) is followed by a new attempt after a jittered
      exponential backoff (tenacity's ``wait_random_exponential``), unless
      another attempt of the upload still runs (that one carries on).
      ``max_attempts`` counts the first attempt and the retries; the hedge
      comes on top. A non-retryable error fails the upload at once.
    * **Bounds**: each attempt is cut after ``attempt_timeout_s``; whatever the
      mode, the upload fails with :class:`TransientStorageError` ("missed its
      Ns deadline") once ``deadline_s`` has passed, whatever still runs.
    * **Losers are discarded, not cancelled**: every attempt but the winner
      (failed, timed out, slower than the winner, still running at the
      deadline) is handed to :class:`~dstl_server.discards.LoserDiscarder`,
      which deletes its key in a batch once it has ended.

    Invariants: ``upload`` returns only the key of an attempt whose ``put``
    returned; at most two attempts of one upload run at once; every time
    decision (hedge delay, attempt timeout, backoff, deadline, discard
    batching, budget window, latencies) reads the injected ``clock`` and waits
    with the injected ``sleep`` (defaults: the running loop's time and
    ``asyncio.sleep``).

    Why the loop is explicit rather than tenacity's ``AsyncRetrying``: that
    runs one attempt at a time and abandons it when it fails, while here an
    attempt keeps running when its hedge starts or the deadline passes, and
    the first of two to succeed wins. tenacity still supplies the backoff
    (``UploadPolicy.backoff_wait``) and the retries of the discard deletes.

    Which task may call: :meth:`upload` from any task on the sidecar's event
    loop (the scheduler's upload tasks, several at once); :meth:`close` once,
    from the shutdown task, after the last upload returned.
    """

    def __init__(
        self,
        store: BlobStore,
        policy: UploadPolicy,
        metrics: ServerMetrics,
        *,
        clock: Clock = loop_time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.store = store
        self.policy = policy
        self.metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self.latencies = LatencyTracker(policy.latency_window, policy.min_samples)
        self.budget = HedgeBudget(policy.hedge_budget_fraction, policy.hedge_budget_window_s, clock)
        self.discards = LoserDiscarder(store, policy, metrics, clock=clock, sleep=sleep)
        if policy.hedge_mode == "fixed":
            metrics.hedge_delay.set(policy.hedge_delay_s)
        elif policy.hedge_mode == "adaptive":
            metrics.hedge_delay.set(policy.hedge_max_delay_s)

    def hedge_delay(self, nbytes: int) -> float | None:
        """Seconds after which an attempt for ``nbytes`` gets a hedge; None: never."""
        p = self.policy
        if p.hedge_mode == "off":
            return None
        if p.hedge_mode == "fixed":
            return p.hedge_delay_s
        q = self.latencies.quantile(nbytes, p.hedge_quantile)
        if q is None:
            return p.hedge_max_delay_s
        return min(max(q, p.hedge_min_delay_s), p.hedge_max_delay_s)

    @property
    def pending_discards(self) -> int:
        """Discard tasks still running (attempts to wait for, batches to delete)."""
        return self.discards.pending

    async def upload(self, job_id: str, data: bytes) -> str:
        p, m = self.policy, self.metrics
        nbytes = len(data)
        started = self._clock()
        deadline = started + p.deadline_s
        self.budget.note_upload()
        delay = self.hedge_delay(nbytes)
        if delay is not None:
            m.hedge_delay.set(delay)
        run = _Run(job_id, data)
        missed_deadline = False
        try:
            self._start(run, hedge=False)
            while True:
                now = self._clock()
                if now >= deadline:
                    missed_deadline = True
                    m.upload_deadline_exceeded.inc()
                    raise deadline_error(p, nbytes, run.number, run.errors, len(run.live))
                hedge_at: float | None = None
                if delay is not None and not run.hedge_asked and len(run.live) == 1:
                    hedge_at = next(iter(run.live.values())).started + delay
                wake = min(t for t in (deadline, hedge_at, run.retry_at) if t is not None)
                failed = run.collect(await wait_first(run.live, wake - now, self._sleep))
                if run.winner is not None:
                    return self._won(run.winner, nbytes, started, run.number)
                for exc in failed:
                    if not is_retryable(exc):
                        raise upload_error(exc, nbytes, run.number)
                if failed and not run.live:
                    if run.tries >= p.max_attempts:
                        raise upload_error(failed[-1], nbytes, run.number)
                    if run.retry_at is None:
                        run.retry_at = self._clock() + p.backoff_s(len(run.errors))
                now = self._clock()
                if now >= deadline:
                    continue
                if run.retry_at is not None and now >= run.retry_at:
                    run.retry_at = None
                    m.upload_retries.inc()
                    self._start(run, hedge=False)
                elif hedge_at is not None and now >= hedge_at and len(run.live) == 1:
                    run.hedge_asked = True
                    if self.budget.try_acquire():
                        m.hedges_started.inc()
                        self._start(run, hedge=True)
                    else:
                        m.hedges_skipped_budget.inc()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                m.uploads.labels("failed").inc()
                m.upload_attempts.observe(run.number)
                m.upload_failures.labels("deadline" if missed_deadline else failure_kind(exc)).inc()
            raise
        finally:
            self.discards.discard([*run.ended, *run.live.values()])

    def _start(self, run: _Run, *, hedge: bool) -> None:
        run.number += 1
        if not hedge:
            run.tries += 1
        key = new_object_key(run.job_id)
        task = asyncio.get_running_loop().create_task(self._attempt(key, run.data))
        run.live[task] = Attempt(key, task, self._clock(), hedge)

    def _won(self, winner: Attempt, nbytes: int, started: float, attempts: int) -> str:
        m = self.metrics
        if winner.hedge:
            m.hedges_won.inc()
        m.uploads.labels("ok").inc()
        m.upload_attempts.observe(attempts)
        m.upload_bytes.inc(nbytes)
        m.upload_size.observe(nbytes)
        m.upload_latency.labels(size_class(nbytes)).observe(self._clock() - started)
        return winner.key

    async def _attempt(self, key: str, data: bytes) -> None:
        started = self._clock()
        try:
            await within(self.store.put(key, data), self.policy.attempt_timeout_s, self._sleep)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.metrics.storage_failures.labels("put", failure_kind(exc)).inc()
            release_frames(exc)
            raise
        # Losers that finish late are recorded too: they are real store latencies.
        self.latencies.record(len(data), self._clock() - started)

    async def close(self, timeout_s: float = 30.0) -> None:
        """Wait up to ``timeout_s`` for losing attempts to end and be deleted.

        Queued deletes go out at once. Past the timeout the remaining
        attempts are cancelled and their deletes tried once more, briefly.
        """
        await self.discards.close(timeout_s)
