"""One owner for the node's uploads: starting them, the job queues, and their end.

:class:`Uploads` (one per node, owned by the registry) starts an upload of
changesets a writer closed, queues it in its job's
:class:`~dstl_server.batching.BatchingScheduler` (one object per flush) and,
when its future completes, hands the outcome to the writer
(``upload_done``: the writer log records it in its own maps) and releases
what the writer freed from the budget.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from dstl_client.core.errors import Backpressure, DstlError, InvalidArgument
from dstl_client.core.format import Changeset
from dstl_client.core.handle import HandleEntry
from dstl_client.core.keys import check_job_id
from dstl_server.batching import MAX_SENDER_CHARS, BatchingScheduler
from dstl_server.forwarder import ForwardedSection, ParentForwarder, decode_forwarded
from dstl_server.metrics import ServerMetrics
from dstl_server.settings import ServerSettings
from dstl_server.throttle import MemoryBudget
from dstl_server.upload_task import UploadingWriter, UploadTask
from dstl_server.uploader import Uploader


class Uploads:
    """Every upload of this node, from start to completion.

    :meth:`start` tells the writer of the task (it marks the changesets
    uploading) and queues it in its job's scheduler (created on first use;
    every job shares ``max_concurrent_uploads`` upload slots). When the
    task's future completes, :meth:`_done` runs once: the writer records the
    outcome (:meth:`~dstl_server.log.WriterLog.upload_done`) and what it
    freed is released from the :class:`~dstl_server.throttle.MemoryBudget`.

    Invariant: ``running`` holds exactly the started tasks whose completion
    has not run. Event-loop only; the registry is its only caller.
    """

    def __init__(
        self,
        settings: ServerSettings,
        uploader: Uploader,
        metrics: ServerMetrics,
        budget: MemoryBudget,
        open_writers: Callable[[str], int],
        forwarder: ParentForwarder | None = None,
    ) -> None:
        self.settings = settings
        self.forwarder = forwarder
        self.uploader = uploader
        self.metrics = metrics
        self.budget = budget
        self._open_writers = open_writers
        self._schedulers: dict[str, BatchingScheduler] = {}
        self._slots = asyncio.Semaphore(settings.max_concurrent_uploads)
        # bulk objects leave one upload slot to the others (when there are two or more)
        self._bulk_slots = asyncio.Semaphore(max(1, settings.max_concurrent_uploads - 1))
        self.running: set[UploadTask] = set()

    def _scheduler(self, job_id: str) -> BatchingScheduler:
        sch = self._schedulers.get(job_id)
        if sch is None:
            s = self.settings
            sch = BatchingScheduler(
                job_id,
                persist_delay_s=s.persist_delay_ms / 1000.0,
                max_wait_s=s.persist_max_wait_ms / 1000.0,
                size_threshold=s.batch_size_threshold,
                uploader=self.uploader,
                upload_slots=self._slots,
                bulk_slots=self._bulk_slots,
                metrics=self.metrics,
                open_writers=lambda: self._open_writers(job_id),
                forwarder=self.forwarder,
            )
            self._schedulers[job_id] = sch
        return sch

    def start(
        self, writer: UploadingWriter, changesets: list[Changeset], *, preemptive: bool
    ) -> UploadTask:
        """Upload ``changesets`` (taken out of not-uploaded, SQN order) as one log section.

        ``preemptive``: not for a persist (the active changeset outgrew its
        threshold, or memory is full); counted in ``dstl_preemptive_uploads_total``.
        """
        fut: asyncio.Future[HandleEntry] = asyncio.get_running_loop().create_future()
        task = UploadTask(writer, changesets, preemptive, fut)
        writer.upload_started(task)
        self.running.add(task)
        fut.add_done_callback(lambda _: self._done(task))
        if preemptive:
            self.metrics.preemptive_uploads.inc()
        self._scheduler(writer.job_id).submit(task)
        return task

    def persist_queued(self, writer: UploadingWriter) -> None:
        """A persist of ``writer`` that started no upload (nothing new since its
        last one): it still counts as arrived in its job's round."""
        self._scheduler(writer.job_id).persist_queued(writer)

    async def accept_forwarded(
        self, job_id: str, sections: list[bytes], *, sender: str = ""
    ) -> list[HandleEntry]:
        """A child's flush: its sections join the job's next object; their entries, once complete.

        Every section goes into the same object (queued at once). ``sender``
        names the child (see :class:`BatchingScheduler`: whom a flush waits
        for); empty: an unnamed child, never waited for. Raises
        :class:`InvalidArgument` for a malformed section or sender,
        ``UploadFailed`` or ``ShuttingDown`` when the object could not be
        completed.
        """
        check_job_id(job_id)
        if not sections:
            raise InvalidArgument("Forward needs at least one section")
        if len(sender) > MAX_SENDER_CHARS:
            raise InvalidArgument(f"sender names are at most {MAX_SENDER_CHARS} characters")
        decoded = [decode_forwarded(data) for data in sections]
        if self.budget.over:  # the child uploads itself rather than wait here
            raise Backpressure("this node holds too many bytes not yet uploaded to take more")
        await self.budget.acquire(sum(sec.length for sec in decoded))
        loop = asyncio.get_running_loop()
        tasks = [ForwardedSection(sec, loop.create_future()) for sec in decoded]
        for t in tasks:  # held until its object is complete (or failed), even if the call ends
            t.future.add_done_callback(functools.partial(self._release_forwarded, t.nbytes))
        self._scheduler(job_id).submit_many(tasks, sender=sender)
        entries = [await t.future for t in tasks]
        self.metrics.forward_received_batches.inc()
        self.metrics.forward_received_bytes.inc(sum(len(d) for d in sections))
        return entries

    def _release_forwarded(self, nbytes: int, fut: asyncio.Future[HandleEntry]) -> None:
        if not fut.cancelled():
            fut.exception()  # retrieved: a failure is logged by the scheduler, not per future
        self.budget.release(nbytes)

    def flush_all(self, trigger: str) -> None:
        for sch in self._schedulers.values():
            sch.flush(trigger)

    def _done(self, task: UploadTask) -> None:
        self.running.discard(task)
        self.budget.release(task.log.upload_done(task))

    def abandon(self, failure: DstlError) -> None:
        """Fail every running upload with ``failure`` (shutdown past its grace)."""
        for task in list(self.running):
            if not task.future.done():
                task.future.set_exception(failure)

    async def drain(self, timeout_s: float) -> bool:
        """Flush every queue and wait for running uploads; refuse new tasks."""
        results = await asyncio.gather(*(s.drain(timeout_s) for s in self._schedulers.values()))
        return all(results)
