"""The log registry: every writer on this node, their SQNs, persists and uploads."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from dstl_client.core.errors import (
    ChangeTooLarge,
    DstlError,
    InvalidArgument,
    LogNotFound,
    ShuttingDown,
    TooManyWriters,
    UploadFailed,
)
from dstl_client.core.format import Changeset, PackedChanges, check_packed
from dstl_client.core.handle import ChangelogHandle, HandleEntry
from dstl_client.core.keys import check_job_id
from dstl_server.batching import BatchingScheduler
from dstl_server.log import PART_OVERHEAD_BYTES, UploadTask, WriterLog
from dstl_server.metrics import ServerMetrics
from dstl_server.settings import ServerSettings
from dstl_server.throttle import MemoryBudget
from dstl_server.uploader import Uploader

log = logging.getLogger(__name__)

_MAX_KEY_GROUP = 1 << 24


@dataclass(frozen=True, slots=True)
class PendingPersist:
    """A persist between its synchronous part and its handle."""

    log: WriterLog
    after: int
    to_sqn: int
    parts: list[HandleEntry | UploadTask]
    started: float


class LogRegistry:
    """All writers of this sidecar and the per-job upload schedulers.

    Implements the FLIP-158 writer contract: SQNs are generated here;
    ``persist`` reuses sections already uploaded or uploading and uploads only
    what is new; ``truncate`` frees memory but never deletes an object (a
    handle may reference it); ``close`` drops unpersisted changes.

    Event-loop only: every method runs on the server's loop.
    """

    def __init__(
        self, settings: ServerSettings, uploader: Uploader, metrics: ServerMetrics
    ) -> None:
        self.settings = settings
        self.uploader = uploader
        self.metrics = metrics
        self._logs: dict[str, WriterLog] = {}
        self._writers_per_job: dict[str, int] = {}
        self._schedulers: dict[str, BatchingScheduler] = {}
        self._upload_slots = asyncio.Semaphore(settings.max_concurrent_uploads)
        self.budget = MemoryBudget(
            settings.max_in_flight_bytes, settings.backpressure_timeout_s, self._relieve_pressure
        )
        self._stopping = False
        #: persist calls waiting for their uploads right now
        self.waiting_persists = 0

    # ---------------------------------------------------------------- lookup
    def get(self, log_id: str) -> WriterLog:
        wl = self._logs.get(log_id)
        if wl is None:
            raise LogNotFound(
                f"unknown writer {log_id[:64]!r}: never created, closed, expired after "
                f"{self.settings.writer_idle_timeout_s:g}s without a call, or the sidecar "
                "restarted (unpersisted changes are gone; recover from the last checkpoint)"
            )
        wl.last_call = time.monotonic()
        return wl

    def __len__(self) -> int:
        return len(self._logs)

    def _scheduler(self, job_id: str) -> BatchingScheduler:
        sch = self._schedulers.get(job_id)
        if sch is None:
            s = self.settings
            sch = BatchingScheduler(
                job_id,
                persist_delay_s=s.persist_delay_ms / 1000.0,
                size_threshold=s.batch_size_threshold,
                uploader=self.uploader,
                upload_slots=self._upload_slots,
                metrics=self.metrics,
                open_writers=lambda: self._writers_per_job.get(job_id, 0),
            )
            self._schedulers[job_id] = sch
        return sch

    # ---------------------------------------------------------------- writers
    def create_writer(
        self, job_id: str, operator_id: str, key_group_range: tuple[int, int]
    ) -> WriterLog:
        if self._stopping:
            raise ShuttingDown("the sidecar is shutting down")
        check_job_id(job_id)
        if not operator_id or len(operator_id) > 256:
            raise InvalidArgument("operator_id must be 1-256 characters")
        first, last = key_group_range
        if not 0 <= first <= last < _MAX_KEY_GROUP:
            raise InvalidArgument(
                f"bad key-group range [{first}, {last}]: need 0 <= first <= last < {_MAX_KEY_GROUP}"
            )
        if len(self._logs) >= self.settings.max_writers:
            self.metrics.writer_quota_refusals.labels("node").inc()
            raise TooManyWriters(
                f"this sidecar holds {len(self._logs)} writers (max_writers="
                f"{self.settings.max_writers}); close writers or raise the limit"
            )
        per_job = self._writers_per_job.get(job_id, 0)
        if per_job >= self.settings.max_writers_per_job:
            self.metrics.writer_quota_refusals.labels("job").inc()
            raise TooManyWriters(
                f"job {job_id!r} holds {per_job} writers on this sidecar (max_writers_per_job="
                f"{self.settings.max_writers_per_job}); close writers or raise the limit"
            )
        wl = WriterLog(job_id, operator_id, key_group_range)
        wl.last_call = time.monotonic()
        self._logs[wl.log_id] = wl
        self._writers_per_job[job_id] = self._writers_per_job.get(job_id, 0) + 1
        self.metrics.writers.set(len(self._logs))
        log.info(
            "writer %s created for job %s op %s kg %s",
            wl.log_id,
            job_id,
            operator_id,
            key_group_range,
        )
        return wl

    async def append(self, log_id: str, batches: Sequence[tuple[int, PackedChanges]]) -> int:
        """Validate every batch first, then append them all (all or nothing)."""
        wl = self.get(log_id)
        wl.check_open()
        nbytes = 0
        count = 0
        limit = self.settings.max_change_bytes
        if not batches:
            raise InvalidArgument("empty append batch")
        for kg, packed in batches:
            wl.check_key_group(kg)
            try:
                check_packed(packed, limit)
            except ValueError as exc:
                cls = ChangeTooLarge if "exceeds the limit" in str(exc) else InvalidArgument
                raise cls(f"key group {kg}: {exc}") from None
            if packed.count == 0:
                raise InvalidArgument(f"key group {kg}: a part must hold at least one change")
            nbytes += packed.nbytes + PART_OVERHEAD_BYTES
            count += packed.count
        if self.budget.over:
            self.metrics.backpressure_waits.inc()
        await self.budget.acquire(nbytes)
        if wl.closed:  # closed while we waited for memory
            self.budget.release(nbytes)
            wl.check_open()
        for kg, packed in batches:
            wl.append(kg, packed)
        sqn = wl.active_sqn  # before a pre-emptive upload closes the changeset
        self.metrics.appended_bytes.inc(nbytes - PART_OVERHEAD_BYTES * len(batches))
        self.metrics.appended_changes.inc(count)
        self.metrics.append_requests.inc()
        self.metrics.unuploaded_bytes.set(self.budget.used)
        threshold = self.settings.preemptive_persist_threshold
        if threshold and wl.active_bytes >= threshold:
            self._upload_preemptively(wl)
        return sqn

    def last_appended_sqn(self, log_id: str) -> int:
        wl = self.get(log_id)
        wl.check_open()
        return wl.rollover()

    async def persist(self, log_id: str, after: int) -> ChangelogHandle:
        """Durable handle for every change of the writer with SQN >= ``after``."""
        return await self.finish_persist(self.begin_persist(log_id, after))

    def begin_persist(self, log_id: str, after: int) -> PendingPersist:
        """The synchronous part: close the changeset, queue what is new, collect sections.

        Changes appended after this call are not in the handle, whatever
        happens while the uploads run.
        """
        started = time.perf_counter()
        self.metrics.persist_requests.inc()
        try:
            wl = self.get(log_id)
            wl.check_open()
            wl.check_persist_from(after)
            to_sqn = wl.rollover()
            new = wl.take_not_uploaded(after)
            if new:
                self._submit(wl, new, preemptive=False)
            parts = wl.sections_from(after)
        except DstlError:
            self.metrics.persist_failures.inc()
            raise
        return PendingPersist(wl, after, to_sqn, parts, started)

    async def finish_persist(self, pending: PendingPersist) -> ChangelogHandle:
        """Wait for the uploads the persist needs; build its handle."""
        wl = pending.log
        self.waiting_persists += 1
        try:
            entries: list[HandleEntry] = []
            for part in pending.parts:
                if isinstance(part, UploadTask):
                    entry = await asyncio.shield(part.future)
                else:
                    entry = part
                if not entries or entries[-1] != entry:
                    entries.append(entry)
            handle = ChangelogHandle(
                wl.job_id,
                wl.log_id,
                wl.key_group_range,
                pending.after,
                pending.to_sqn,
                tuple(entries),
            )
        except DstlError as exc:
            self.metrics.persist_failures.inc()
            if isinstance(exc, UploadFailed):
                log.warning("persist of writer %s failed: %s", wl.log_id, exc.message)
            raise
        finally:
            self.waiting_persists -= 1
        self.metrics.persist_latency.observe(time.perf_counter() - pending.started)
        return handle

    def truncate(self, log_id: str, before: int) -> None:
        wl = self.get(log_id)
        wl.check_open()
        freed = wl.truncate(before)
        if freed:
            self.budget.release(freed)
            self.metrics.unuploaded_bytes.set(self.budget.used)

    def close_writer(self, log_id: str) -> None:
        wl = self.get(log_id)
        del self._logs[log_id]
        n = self._writers_per_job.get(wl.job_id, 1) - 1
        if n:
            self._writers_per_job[wl.job_id] = n
        else:
            self._writers_per_job.pop(wl.job_id, None)
        freed = wl.close()
        if freed:
            self.budget.release(freed)
        self.metrics.writers.set(len(self._logs))
        self.metrics.unuploaded_bytes.set(self.budget.used)

    # ---------------------------------------------------------------- uploads
    def _submit(self, wl: WriterLog, changesets: list[Changeset], preemptive: bool) -> UploadTask:
        nbytes = sum(cs.nbytes for cs in changesets)
        fut: asyncio.Future[HandleEntry] = asyncio.get_running_loop().create_future()
        task = UploadTask(wl, changesets, changesets[-1].sqn + 1, nbytes, preemptive, fut)
        wl.start_upload(task)
        fut.add_done_callback(lambda f: self._on_uploaded(task, f))
        self._scheduler(wl.job_id).submit(task)
        return task

    def _on_uploaded(self, task: UploadTask, fut: asyncio.Future[HandleEntry]) -> None:
        ok = not fut.cancelled() and fut.exception() is None
        freed = task.log.finish_upload(task, fut.result() if ok else None)
        if freed:
            self.budget.release(freed)
        self.metrics.unuploaded_bytes.set(self.budget.used)

    def _upload_preemptively(self, wl: WriterLog) -> None:
        wl.rollover()
        changesets = wl.take_not_uploaded(None)
        if changesets:
            self.metrics.preemptive_uploads.inc()
            self._submit(wl, changesets, preemptive=True)

    def _relieve_pressure(self) -> None:
        """Memory is full: upload every writer's unpersisted changes now."""
        for wl in list(self._logs.values()):
            if wl.active_bytes or wl.not_uploaded:
                self._upload_preemptively(wl)
        for sch in self._schedulers.values():
            sch.flush("pressure")

    # ---------------------------------------------------------------- expiry
    def expire_idle(self, now: float | None = None) -> int:
        """Close writers with no call for ``writer_idle_timeout_s``; return how many.

        A writer whose client died would otherwise hold a slot (and its
        unpersisted bytes) forever. A writer with an upload in flight is not
        idle. Closing drops only unpersisted changes: objects its handles
        reference stay readable.
        """
        now = time.monotonic() if now is None else now
        limit = self.settings.writer_idle_timeout_s
        idle = [
            log_id
            for log_id, wl in self._logs.items()
            if now - wl.last_call >= limit and not wl.uploading
        ]
        for log_id in idle:
            wl = self._logs[log_id]
            log.warning(
                "writer %s of job %s expired after %.0fs without a call", log_id, wl.job_id, limit
            )
            self.close_writer(log_id)
        if idle:
            self.metrics.writers_expired.inc(len(idle))
        return len(idle)

    # ---------------------------------------------------------------- shutdown
    def abandon(self, reason: str) -> int:
        """Fail every upload still running (shutdown past its grace); return waiting persists.

        The persists waiting on them get :class:`ShuttingDown` (typed, with
        ``reason``) instead of a cancelled call; the caller reports the count.
        """
        waiting = self.waiting_persists
        failure = ShuttingDown(reason)
        for wl in self._logs.values():
            for task in wl.uploading.values():
                if not task.future.done():
                    task.future.set_exception(failure)
        return waiting

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting writers; flush queues; wait for running uploads."""
        self._stopping = True
        results = await asyncio.gather(*(s.drain(timeout_s) for s in self._schedulers.values()))
        return all(results)
