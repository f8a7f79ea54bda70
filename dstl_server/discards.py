"""Deleting the objects of upload attempts that did not win, in batches.

Flink FLINK-26485 ``discardResult``: cancelling an HTTP request does not stop
a server that already has the body from committing it, so a cancelled PUT
could land after our DELETE and stay as an orphan. An attempt that lost (the
slower of a hedged pair, a failed or timed-out attempt, one still running
when its upload failed or finished) therefore runs to its own end, bounded by
its own timeout, and then its key is deleted whatever its outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from dstl_server.metrics import ServerMetrics
from dstl_server.storage.base import BlobStore
from dstl_server.upload_clock import Clock, Sleep, wait_first, within
from dstl_server.upload_policy import UploadPolicy, failure_kind, is_retryable, release_frames

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Attempt:
    """One ``put`` of an upload: the new key it writes and the task running it."""

    key: str
    task: asyncio.Task[None]
    started: float
    hedge: bool = False


class LoserDiscarder:
    """Deletes the keys of losing attempts, many uploads' losers in one request.

    Invariants: an attempt handed to :meth:`discard` is not cancelled (only
    :meth:`close`, past its timeout, cancels what is left); once it has ended
    its key is queued, and queued keys go out together in one ``delete`` after
    ``discard_batch_delay_s`` (at once once :meth:`close` has begun). A batch
    is retried (tenacity: ``discard_attempts``, jittered backoff on the
    injected ``sleep``) only when one of its attempts is known to have stored
    its object; when all of them failed, most likely nothing landed, so one
    try is enough and a store in trouble is not asked again and again. Keys
    that could not be deleted are counted in ``discard_failures`` and left to
    the orphan cleaner.

    Event-loop only: :meth:`discard` is called by the upload engine from the
    upload tasks; :meth:`close` once, from the shutdown task.
    """

    def __init__(
        self,
        store: BlobStore,
        policy: UploadPolicy,
        metrics: ServerMetrics,
        *,
        clock: Clock,
        sleep: Sleep,
    ) -> None:
        self.store = store
        self.policy = policy
        self.metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self._tasks: set[asyncio.Task[None]] = set()
        self._doomed: list[str] = []  # keys of ended losing attempts, to delete
        self._doomed_landed = False  # one of them is known to have stored its object
        self._deleter: asyncio.Task[None] | None = None
        self._flush_now = asyncio.Event()

    @property
    def pending(self) -> int:
        """Tasks still running (attempts to wait for, batches to delete)."""
        return len(self._tasks)

    def discard(self, attempts: Sequence[Attempt]) -> None:
        """Delete the keys of ``attempts`` once each has ended (in the background)."""
        if attempts:
            self._spawn(self._discard(list(attempts)))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _discard(self, attempts: list[Attempt]) -> None:
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
            self._deleter = self._spawn(self._delete_batch())

    async def _delete_batch(self) -> None:
        """After ``discard_batch_delay_s`` (at once when closing), delete the queued keys."""
        p = self.policy
        if not self._flush_now.is_set():
            with contextlib.suppress(TimeoutError):
                await within(self._flush_now.wait(), p.discard_batch_delay_s, self._sleep)
        keys, landed = self._doomed, self._doomed_landed
        self._doomed, self._doomed_landed, self._deleter = [], False, None
        retrying = AsyncRetrying(
            stop=stop_after_attempt(p.discard_attempts if landed else 1),
            wait=p.backoff_wait(),
            retry=retry_if_exception(is_retryable),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._delete(keys)
        except Exception as exc:
            self.metrics.discard_failures.inc(len(keys))
            log.warning(
                "could not delete the objects of losing or failed upload attempts: %s",
                exc,
                extra={"object_key": keys[0], "object_keys": len(keys)},
            )
        else:
            self.metrics.attempts_discarded.inc(len(keys))

    async def _delete(self, keys: list[str]) -> None:
        try:
            await within(self.store.delete(keys), self.policy.attempt_timeout_s, self._sleep)
        except Exception as exc:
            release_frames(exc)
            self.metrics.storage_failures.labels("delete", failure_kind(exc)).inc()
            raise

    async def close(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for losing attempts to end and be deleted.

        Queued deletes go out at once. Past the timeout the remaining
        attempts are cancelled and their deletes tried once more, briefly.
        """
        self._flush_now.set()
        if await self._wait_all(self._clock() + timeout_s):
            return
        for task in list(self._tasks):
            task.cancel()
        await self._wait_all(self._clock() + min(5.0, self.policy.attempt_timeout_s))

    async def _wait_all(self, until: float) -> bool:
        """Wait for every task, also those started meanwhile; True if none is left."""
        while self._tasks:
            left = until - self._clock()
            if left <= 0:
                return False
            await wait_first(set(self._tasks), left, self._sleep)
        return True
