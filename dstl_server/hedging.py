"""Request hedging and retries for uploads (seed 000 "Request hedging"; Flink ``RetryingExecutor``).

One call of :meth:`HedgingUploader.upload` stores one object. The rules:

* **Every attempt writes a new key** (``keys.new_object_key``); attempts never
  overwrite each other, so the first attempt to succeed simply wins and
  ``upload`` returns its key. A key is returned only after its ``put``
  returned, so it always names a complete object.
* **Hedging**: when the only running attempt has not finished after the hedge
  delay, a second attempt (the *hedge*) starts on a new key while the first
  goes on. At most one hedge per upload, so at most two attempts are in
  flight. The delay is, by ``mode``: ``adaptive``, a high quantile of recent
  successful attempt latencies of the same size class, clamped to
  ``[min_delay_s, max_delay_s]`` (``max_delay_s`` until enough samples exist);
  ``fixed``, ``fixed_delay_s``; ``off``, no hedging.
* **Hedge budget**: hedges stay below ``budget_fraction`` of the uploads
  started in the last ``budget_window_s`` (:class:`HedgeBudget`), so a store
  that is slow for everyone is not hit twice as hard. A hedge the budget
  refuses is skipped, not queued.
* **Retries**: an attempt that fails with a retryable error
  (:attr:`StorageError.retryable`, or its per-attempt timeout) is followed by
  a new attempt after a jittered exponential backoff (tenacity's
  ``wait_random_exponential``), unless another attempt of the upload is still
  running (that one carries on instead). ``max_attempts`` counts the first
  attempt and the retries; the hedge comes on top, so an upload makes at most
  ``max_attempts + 1`` attempts. A non-retryable error fails the upload at
  once.
* **Bounds**: each attempt is cut after ``attempt_timeout_s``; the whole upload
  fails with :class:`TransientStorageError` once ``deadline_s`` has passed,
  whatever is still running.
* **Losers are discarded, not cancelled.** Cancelling an HTTP request does not
  stop a server that already has the body from committing it, so a cancelled
  PUT could land after our DELETE and stay as an orphan. Every attempt other
  than the winner (the slower of a hedged pair, failed attempts, attempts still
  running when the upload fails) therefore runs to its end in the background,
  bounded by its own timeout, and then its key is deleted whatever its outcome
  (Flink FLINK-26485 ``discardResult``). Keys to delete are batched over
  ``discard_batch_delay_s`` into one DeleteObjects request, retried only when
  one of those attempts is known to have stored its object (so a store that
  refuses everything is not asked again and again). :meth:`HedgingUploader.close` waits
  for these discards; the sidecar calls it before closing the store.

Everything here runs on the sidecar's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import AsyncRetrying, RetryCallState, wait_random_exponential

from dstl_client.errors import DstlError, StorageError, TransientStorageError
from dstl_server.keys import new_object_key
from dstl_server.metrics import ServerMetrics, size_class
from dstl_server.settings import ServerSettings
from dstl_server.storage.base import BlobStore
from dstl_server.uploader import RetryingUploader, Uploader, UploadPolicy, release_frames

log = logging.getLogger(__name__)

HEDGE_MODES = ("adaptive", "fixed", "off")


@dataclass(frozen=True, slots=True)
class HedgingPolicy:
    """Limits of one upload and the hedging knobs (see the module docstring)."""

    attempt_timeout_s: float = 10.0
    max_attempts: int = 3
    retry_base_delay_s: float = 0.1
    retry_max_delay_s: float = 2.0
    deadline_s: float = 30.0
    mode: str = "adaptive"
    fixed_delay_s: float = 0.5
    quantile: float = 0.95
    min_delay_s: float = 0.05
    max_delay_s: float = 2.0
    budget_fraction: float = 0.05
    budget_window_s: float = 60.0
    #: latency samples kept per size class (the newest ones)
    latency_window: int = 500
    #: samples a size class needs before its quantile replaces ``max_delay_s``
    min_samples: int = 20
    #: attempts at deleting a losing attempt's object
    discard_attempts: int = 3
    #: losing attempts' keys wait this long to be deleted together (one request)
    discard_batch_delay_s: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in HEDGE_MODES:
            raise ValueError(f"hedge mode {self.mode!r}: expected one of {HEDGE_MODES}")
        if self.max_attempts < 1 or self.latency_window < 1 or self.min_samples < 1:
            raise ValueError("max_attempts, latency_window and min_samples must be >= 1")
        if not 0 <= self.min_delay_s <= self.max_delay_s:
            raise ValueError("need 0 <= min_delay_s <= max_delay_s")
        if min(self.attempt_timeout_s, self.deadline_s, self.budget_window_s) <= 0:
            raise ValueError("timeouts and the budget window must be > 0")

    @classmethod
    def from_settings(cls, s: ServerSettings) -> HedgingPolicy:
        return cls(
            attempt_timeout_s=s.upload_timeout_s,
            max_attempts=s.upload_max_attempts,
            retry_base_delay_s=s.upload_retry_base_delay_ms / 1000.0,
            deadline_s=s.upload_deadline_s,
            mode=s.hedge_mode,
            fixed_delay_s=s.hedge_delay_ms / 1000.0,
            quantile=s.hedge_quantile,
            min_delay_s=s.hedge_min_delay_ms / 1000.0,
            max_delay_s=s.hedge_max_delay_ms / 1000.0,
            budget_fraction=s.hedge_budget_fraction,
            budget_window_s=s.hedge_budget_window_s,
        )


def make_uploader(store: BlobStore, settings: ServerSettings, metrics: ServerMetrics) -> Uploader:
    """The sidecar's uploader: hedging unless ``hedge_mode`` is ``off``.

    With hedging off the plain :class:`RetryingUploader` is used (one attempt
    at a time, retried on retryable errors).
    """
    if settings.hedge_mode == "off":
        return RetryingUploader(
            store,
            UploadPolicy(
                attempt_timeout_s=settings.upload_timeout_s,
                max_attempts=settings.upload_max_attempts,
                retry_base_delay_s=settings.upload_retry_base_delay_ms / 1000.0,
            ),
            metrics,
        )
    return HedgingUploader(store, HedgingPolicy.from_settings(settings), metrics)


class LatencyTracker:
    """Latencies of recent successful attempts, per size class.

    Invariant: each size class (``metrics.size_class``) keeps at most
    ``window`` samples, the newest ones. :meth:`quantile` answers ``None``
    until a class holds ``min_samples`` samples, so a cold start does not
    hedge on two lucky samples.
    """

    def __init__(self, window: int = 500, min_samples: int = 20) -> None:
        self.window = window
        self.min_samples = min_samples
        self._samples: dict[str, deque[float]] = {}

    def record(self, nbytes: int, seconds: float) -> None:
        cls = size_class(nbytes)
        samples = self._samples.get(cls)
        if samples is None:
            samples = self._samples[cls] = deque(maxlen=self.window)
        samples.append(seconds)

    def count(self, nbytes: int) -> int:
        samples = self._samples.get(size_class(nbytes))
        return len(samples) if samples is not None else 0

    def quantile(self, nbytes: int, q: float) -> float | None:
        """The nearest-rank ``q`` quantile of the class of ``nbytes``, or None."""
        samples = self._samples.get(size_class(nbytes))
        if samples is None or len(samples) < self.min_samples:
            return None
        ordered = sorted(samples)
        rank = max(1, math.ceil(q * len(ordered)))
        return ordered[rank - 1]


class HedgeBudget:
    """Hedges allowed: at most ``fraction`` of the uploads of the last ``window_s``.

    Counts live in about 60 time buckets of ``window_s / 60`` each (bounded
    memory whatever the rate). Invariant: :meth:`try_acquire` grants a hedge
    only if, counted over the buckets of the window, ``hedges + 1 <=
    fraction * uploads``. Uploads are counted when they start
    (:meth:`note_upload`), so the upload asking for a hedge counts itself.
    """

    BUCKETS = 60

    def __init__(
        self, fraction: float, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.fraction = fraction
        self.window_s = window_s
        self._width = window_s / self.BUCKETS
        self._clock = clock
        # [bucket index, uploads, hedges], oldest first
        self._buckets: deque[list[int]] = deque()
        self._uploads = 0
        self._hedges = 0

    def _current(self) -> list[int]:
        index = int(self._clock() // self._width)
        oldest_kept = index - self.BUCKETS + 1
        while self._buckets and self._buckets[0][0] < oldest_kept:
            _, u, h = self._buckets.popleft()
            self._uploads -= u
            self._hedges -= h
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append([index, 0, 0])
        return self._buckets[-1]

    def note_upload(self) -> None:
        self._current()[1] += 1
        self._uploads += 1

    def try_acquire(self) -> bool:
        """Take one hedge from the budget if there is room; False otherwise."""
        bucket = self._current()
        if self._hedges + 1 > self.fraction * self._uploads:
            return False
        bucket[2] += 1
        self._hedges += 1
        return True

    @property
    def uploads(self) -> int:
        self._current()
        return self._uploads

    @property
    def hedges(self) -> int:
        self._current()
        return self._hedges


@dataclass(slots=True)
class _Attempt:
    key: str
    number: int
    hedge: bool
    started: float
    task: asyncio.Task[None]


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or (isinstance(exc, StorageError) and exc.retryable)


def _kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, DstlError):
        return exc.kind
    return "other"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "attempt timed out"
    if isinstance(exc, DstlError):
        return exc.message
    return repr(exc)


class HedgingUploader(Uploader):
    """Uploads with hedged attempts, retries, a deadline and loser discards.

    Invariants: ``upload`` returns only the key of an attempt whose ``put``
    returned; every other attempt's key is deleted once that attempt has ended
    (best effort, retried; an object a failing store keeps is left to the
    orphan cleaner); at most two attempts of one upload run at once; hedges
    over the window stay within the budget. Event-loop only.
    """

    def __init__(
        self,
        store: BlobStore,
        policy: HedgingPolicy,
        metrics: ServerMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.policy = policy
        self.metrics = metrics
        self.latencies = LatencyTracker(policy.latency_window, policy.min_samples)
        self.budget = HedgeBudget(policy.budget_fraction, policy.budget_window_s, clock)
        self._discards: set[asyncio.Task[None]] = set()
        self._doomed: list[str] = []  # keys of ended losing attempts, to delete
        self._doomed_landed = False  # one of them is known to have stored its object
        self._deleter: asyncio.Task[None] | None = None
        self._flush_now = asyncio.Event()
        self._wait = wait_random_exponential(
            multiplier=policy.retry_base_delay_s, max=policy.retry_max_delay_s
        )
        if policy.mode == "fixed":
            metrics.hedge_delay.set(policy.fixed_delay_s)
        elif policy.mode == "adaptive":
            metrics.hedge_delay.set(policy.max_delay_s)

    # ------------------------------------------------------------ hedge delay
    def hedge_delay(self, nbytes: int) -> float | None:
        """Seconds after which an attempt for ``nbytes`` gets a hedge; None: never."""
        p = self.policy
        if p.mode == "off":
            return None
        if p.mode == "fixed":
            return p.fixed_delay_s
        q = self.latencies.quantile(nbytes, p.quantile)
        if q is None:
            return p.max_delay_s
        return min(max(q, p.min_delay_s), p.max_delay_s)

    def backoff(self, failures: int) -> float:
        """Jittered exponential delay before the retry that follows ``failures`` failures."""
        state = RetryCallState(AsyncRetrying(), None, (), {})
        state.attempt_number = max(1, failures)
        return float(self._wait(state))

    # ----------------------------------------------------------------- upload
    async def upload(self, job_id: str, data: bytes) -> str:
        loop = asyncio.get_running_loop()
        p = self.policy
        nbytes = len(data)
        started = loop.time()
        deadline = started + p.deadline_s
        self.budget.note_upload()
        delay = self.hedge_delay(nbytes)
        if delay is not None:
            self.metrics.hedge_delay.set(delay)

        live: dict[asyncio.Task[None], _Attempt] = {}
        ended: list[_Attempt] = []  # failed attempts, discarded at the end
        errors: list[BaseException] = []
        number = 0  # attempts started, hedge included
        tries = 0  # attempts counted against max_attempts
        hedge_asked = False
        retry_at: float | None = None
        winner: _Attempt | None = None
        missed_deadline = False

        def start(hedge: bool) -> None:
            nonlocal number, tries
            number += 1
            if not hedge:
                tries += 1
            key = new_object_key(job_id)
            task = loop.create_task(self._attempt(key, data))
            live[task] = _Attempt(key, number, hedge, loop.time(), task)

        try:
            start(hedge=False)
            while True:
                now = loop.time()
                if now >= deadline:
                    missed_deadline = True
                    raise self._deadline_error(nbytes, number, errors, len(live))
                wake = deadline
                hedge_at: float | None = None
                if delay is not None and not hedge_asked and len(live) == 1:
                    (only,) = live.values()
                    hedge_at = only.started + delay
                    wake = min(wake, hedge_at)
                if retry_at is not None:
                    wake = min(wake, retry_at)
                if live:
                    done, _ = await asyncio.wait(
                        live, timeout=max(0.0, wake - now), return_when=asyncio.FIRST_COMPLETED
                    )
                else:
                    await asyncio.sleep(max(0.0, wake - now))
                    done = set()
                failed_now: list[BaseException] = []
                for task in done:
                    att = live.pop(task)
                    exc = task.exception()
                    if exc is None and winner is None:
                        winner = att
                        continue
                    ended.append(att)
                    if exc is not None:
                        errors.append(exc)
                        failed_now.append(exc)
                if winner is not None:
                    return self._won(winner, nbytes, started, number)
                for exc in failed_now:
                    if not _retryable(exc):
                        raise self._final_error(exc, nbytes, number)
                if failed_now and not live:
                    if tries >= p.max_attempts:
                        raise self._final_error(failed_now[-1], nbytes, number)
                    if retry_at is None:
                        retry_at = loop.time() + self.backoff(len(errors))
                now = loop.time()
                if retry_at is not None and now >= retry_at and now < deadline:
                    retry_at = None
                    self.metrics.upload_retries.inc()
                    start(hedge=False)
                elif hedge_at is not None and hedge_at <= now < deadline and len(live) == 1:
                    hedge_asked = True
                    if self.budget.try_acquire():
                        self.metrics.hedges_started.inc()
                        start(hedge=True)
                    else:
                        self.metrics.hedges_skipped_budget.inc()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.metrics.uploads.labels("failed").inc()
                self.metrics.upload_attempts.observe(number)
                kind = "deadline" if missed_deadline else _kind(exc)
                self.metrics.upload_failures.labels(kind).inc()
            raise
        finally:
            self._discard_later([*ended, *live.values()])

    def _won(self, winner: _Attempt, nbytes: int, started: float, attempts: int) -> str:
        m = self.metrics
        if winner.hedge:
            m.hedges_won.inc()
        m.uploads.labels("ok").inc()
        m.upload_attempts.observe(attempts)
        m.upload_bytes.inc(nbytes)
        m.upload_size.observe(nbytes)
        m.upload_latency.labels(size_class(nbytes)).observe(
            asyncio.get_running_loop().time() - started
        )
        return winner.key

    def _deadline_error(
        self, nbytes: int, attempts: int, errors: list[BaseException], running: int
    ) -> TransientStorageError:
        self.metrics.upload_deadline_exceeded.inc()
        last = f"; last error: {_describe(errors[-1])}" if errors else ""
        return TransientStorageError(
            f"upload of {nbytes} bytes missed its {self.policy.deadline_s:g}s deadline "
            f"({attempts} attempt(s), {len(errors)} failed, {running} still running{last})"
        )

    def _final_error(self, exc: BaseException, nbytes: int, attempts: int) -> DstlError:
        why = _describe(exc)
        msg = f"upload of {nbytes} bytes failed after {attempts} attempt(s): {why}"
        if isinstance(exc, TimeoutError):
            return TransientStorageError(msg)
        if isinstance(exc, StorageError):
            return type(exc)(msg, retryable=exc.retryable)
        if isinstance(exc, DstlError):
            return type(exc)(msg)
        return StorageError(msg)

    async def _attempt(self, key: str, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await asyncio.wait_for(self.store.put(key, data), self.policy.attempt_timeout_s)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.metrics.storage_failures.labels("put", _kind(exc)).inc()
            release_frames(exc)
            raise
        # Losers that finish late are recorded too: they are real store latencies.
        self.latencies.record(len(data), loop.time() - started)

    # --------------------------------------------------------------- discards
    def _discard_later(self, attempts: list[_Attempt]) -> None:
        if not attempts:
            return
        task = asyncio.get_running_loop().create_task(self._discard(attempts))
        self._discards.add(task)
        task.add_done_callback(self._discards.discard)

    async def _discard(self, attempts: list[_Attempt]) -> None:
        """Wait for the attempts to end, then queue their keys for a batched delete."""
        tasks = {a.task for a in attempts}
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:  # close() gave up waiting: stop them, still delete
            for t in tasks:
                t.cancel()
        landed = any(t.done() and not t.cancelled() and t.exception() is None for t in tasks)
        self._doomed.extend(a.key for a in attempts)
        self._doomed_landed = self._doomed_landed or landed
        if self._deleter is None:
            self._deleter = asyncio.get_running_loop().create_task(self._delete_batch())
            self._discards.add(self._deleter)
            self._deleter.add_done_callback(self._discards.discard)

    async def _delete_batch(self) -> None:
        """After ``discard_batch_delay_s`` (at once when closing), delete the queued keys.

        One request for the losers of many uploads (hedging costs one PUT per
        hedge plus a fraction of a delete). Retried with backoff when one of
        the attempts is known to have stored its object; when all of them
        failed, most likely nothing landed, so one try is enough and a store
        in trouble is not asked again and again (leftovers are the orphan
        cleaner's).
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._flush_now.wait(), self.policy.discard_batch_delay_s)
        keys, landed = self._doomed, self._doomed_landed
        self._doomed, self._doomed_landed, self._deleter = [], False, None
        tries = self.policy.discard_attempts if landed else 1
        for n in range(1, tries + 1):
            try:
                await asyncio.wait_for(self.store.delete(keys), self.policy.attempt_timeout_s)
            except Exception as exc:
                release_frames(exc)
                self.metrics.storage_failures.labels("delete", _kind(exc)).inc()
                if n == tries or not _retryable(exc):
                    self.metrics.discard_failures.inc(len(keys))
                    log.warning("could not delete %d losing attempt(s): %s", len(keys), exc)
                    return
                await asyncio.sleep(self.backoff(n))
            else:
                self.metrics.attempts_discarded.inc(len(keys))
                return

    @property
    def pending_discards(self) -> int:
        """Discard tasks still running (attempts to wait for, batches to delete)."""
        return len(self._discards)

    async def close(self, timeout_s: float = 30.0) -> None:
        """Wait up to ``timeout_s`` for losing attempts to end and be deleted.

        Queued deletes go out at once. Past the timeout the remaining
        attempts are cancelled and their deletes tried once more, briefly.
        """
        self._flush_now.set()
        loop = asyncio.get_running_loop()
        if await self._wait_discards(loop.time() + timeout_s):
            return
        for task in list(self._discards):
            task.cancel()
        await self._wait_discards(loop.time() + min(5.0, self.policy.attempt_timeout_s))

    async def _wait_discards(self, until: float) -> bool:
        """Wait for every discard task, also those started meanwhile; True if none is left."""
        loop = asyncio.get_running_loop()
        while self._discards:
            left = until - loop.time()
            if left <= 0:
                return False
            await asyncio.wait(set(self._discards), timeout=left)
        return True
