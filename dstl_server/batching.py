"""The upload scheduler: every writer of one job on this node, one object per flush."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dstl_client.core.errors import DstlError, ShuttingDown, UploadFailed
from dstl_client.core.format import BuiltObject, build_object, encode_log_section
from dstl_client.core.handle import HandleEntry
from dstl_server.log import UploadTask
from dstl_server.metrics import ServerMetrics
from dstl_server.uploader import Uploader

log = logging.getLogger(__name__)

#: objects of at most this size are encoded on the event loop (no thread hop)
_INLINE_ENCODE_BYTES = 256 * 1024


class BatchingScheduler:
    """Collects upload tasks of one job and flushes them into single objects.

    A flush takes every queued task and turns it into one object with one log
    section per task. It fires when (a) ``persist_delay_s`` has passed since
    the first task was queued, (b) queued bytes reach ``size_threshold``, or
    (c) every open writer of the job has a persist task queued. Flushed
    objects are uploaded concurrently, at most ``upload_slots`` at a time
    (shared by every job on the node).

    Invariants: a task is in the queue or in exactly one flush; its future is
    completed exactly once, with the entry of a complete object or with an
    error. Event-loop only.
    """

    def __init__(
        self,
        job_id: str,
        *,
        persist_delay_s: float,
        size_threshold: int,
        uploader: Uploader,
        upload_slots: asyncio.Semaphore,
        metrics: ServerMetrics,
        open_writers: Callable[[], int],
    ) -> None:
        self.job_id = job_id
        self.persist_delay_s = persist_delay_s
        self.size_threshold = size_threshold
        self.uploader = uploader
        self.upload_slots = upload_slots
        self.metrics = metrics
        self._open_writers = open_writers
        self._queue: list[UploadTask] = []
        self._queued_bytes = 0
        self._persisting: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def submit(self, task: UploadTask) -> None:
        """Queue a task; flush now or arm the delay timer."""
        if self._closed:
            task.future.set_exception(ShuttingDown("the sidecar is shutting down"))
            return
        self._queue.append(task)
        self._queued_bytes += task.nbytes
        if not task.preemptive:
            self._persisting.add(task.log.log_id)
        if self.persist_delay_s <= 0:
            self.flush("immediate")
        elif self._queued_bytes >= self.size_threshold:
            self.flush("size")
        elif self._persisting and len(self._persisting) >= self._open_writers():
            self.flush("all_waiting")
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.persist_delay_s, self.flush, "delay")

    def flush(self, trigger: str) -> None:
        """Take every queued task into one object and start its upload."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._queue:
            return
        tasks, self._queue = self._queue, []
        self._queued_bytes = 0
        self._persisting.clear()
        self.metrics.flushes.labels(trigger).inc()
        t = asyncio.get_running_loop().create_task(self._upload(tasks))
        self._running.add(t)
        t.add_done_callback(self._running.discard)

    async def _upload(self, tasks: list[UploadTask]) -> None:
        nbytes = sum(t.nbytes for t in tasks)
        self.metrics.in_flight_bytes.inc(nbytes)
        try:
            async with self.upload_slots:
                if nbytes <= _INLINE_ENCODE_BYTES:
                    built = _encode(tasks)
                else:
                    built = await asyncio.to_thread(_encode, tasks)
                key = await self.uploader.upload(self.job_id, built.data)
        except Exception as exc:
            err = exc if isinstance(exc, DstlError) else None
            reason = err.message if err else repr(exc)
            log.warning(
                "upload of %d log section(s) for job %s failed: %s", len(tasks), self.job_id, reason
            )
            failure = UploadFailed(f"upload for job {self.job_id} failed: {reason}")
            for t in tasks:
                if not t.future.done():
                    t.future.set_exception(failure)
            return
        finally:
            self.metrics.in_flight_bytes.dec(nbytes)
        self.metrics.logs_per_object.observe(len(tasks))
        for t, (off, length) in zip(tasks, built.placements, strict=True):
            if not t.future.done():
                t.future.set_result(HandleEntry(key, off, length, t.changesets[0].sqn, t.end_sqn))

    async def drain(self, timeout_s: float) -> bool:
        """Flush what is queued and wait for running uploads; refuse new tasks."""
        self._closed = True
        self.flush("shutdown")
        if not self._running:
            return True
        deadline = time.monotonic() + timeout_s
        _, pending = await asyncio.wait(
            list(self._running), timeout=max(0.0, deadline - time.monotonic())
        )
        return not pending

    def reopen(self) -> None:
        self._closed = False


def _encode(tasks: list[UploadTask]) -> BuiltObject:
    sections = [encode_log_section(t.log.log_id_bytes, t.changesets, t.end_sqn) for t in tasks]
    return build_object(sections)
