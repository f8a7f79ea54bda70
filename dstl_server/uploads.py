"""One owner for an upload's lifecycle: the task, its scheduling and its completion.

:class:`Uploads` (one per node, owned by the registry) starts an upload of
changesets a writer closed, queues it in its job's :class:`BatchingScheduler`
(one object per flush) and, when its future completes, records the outcome in
the writer and frees the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dstl_client.core.errors import (
    Backpressure,
    DstlError,
    InvalidArgument,
    ShuttingDown,
    UploadFailed,
)
from dstl_client.core.format import (
    BuiltObject,
    Changeset,
    EncodedSection,
    build_object,
    encode_log_section,
)
from dstl_client.core.handle import HandleEntry
from dstl_client.core.keys import check_job_id
from dstl_server.forwarder import ForwardedSection, ParentForwarder, decode_forwarded
from dstl_server.log import WriterLog, held_bytes
from dstl_server.metrics import ServerMetrics
from dstl_server.settings import ServerSettings
from dstl_server.throttle import MemoryBudget
from dstl_server.uploader import Uploader

log = logging.getLogger(__name__)

#: objects of at most this size are encoded on the event loop (no thread hop)
_INLINE_ENCODE_BYTES = 256 * 1024
#: a persist's section of at most this size is encoded when it is queued, on
#: the loop, while the flush waits for the job's other writers (up to
#: _INLINE_BUILD_BYTES queued): a flush then only joins sections, and the
#: encoding is off the critical path of every persist
_EARLY_ENCODE_BYTES = 256 * 1024
#: an object whose sections are all encoded is joined on the loop up to this
#: size (one copy, well under a millisecond), in a worker thread beyond
_INLINE_BUILD_BYTES = 4 * 1024 * 1024
#: a section larger than this is bulk (a materialization's part, pressure
#: relief): a flush that also holds a persist's smaller sections uploads the
#: bulk ones in an object of their own, and a bulk object waits for a bulk
#: slot, so a persist never waits for a large upload it is not part of
BULK_SECTION_BYTES = 1 << 20


@dataclass(slots=True, eq=False)
class UploadTask:
    """Changesets of one writer (in SQN order) that go into one log section of one object.

    Invariants: ``future`` is completed exactly once: by the scheduler with
    the entry of a complete object or with an error, or by
    :meth:`Uploads.abandon`. A task made by :meth:`Uploads.start` has every
    changeset in its writer's ``uploading`` map, mapped to it, until that
    completion; then :meth:`Uploads` records the outcome (the future's first
    done-callback, so before any persist waiting on it resumes).
    Event-loop only.
    """

    log: WriterLog
    changesets: list[Changeset]
    preemptive: bool
    future: asyncio.Future[HandleEntry] = field(repr=False)
    _nbytes: int = field(default=-1, repr=False)
    #: the section, once encoded (its changesets are closed: they never change)
    _encoded: EncodedSection | None = field(default=None, repr=False)

    @property
    def end_sqn(self) -> int:
        """Exclusive upper bound of the section's SQN range."""
        return self.changesets[-1].sqn + 1

    @property
    def nbytes(self) -> int:
        """Data bytes of the section's changes (its share of the object; counted once)."""
        if self._nbytes < 0:
            self._nbytes = sum(cs.nbytes for cs in self.changesets)
        return self._nbytes

    @property
    def first_sqn(self) -> int:
        return self.changesets[0].sqn

    @property
    def encoded(self) -> bool:
        return self._encoded is not None

    def encode(self) -> EncodedSection:
        """The log section (encoded on first use, then kept until the task is dropped)."""
        if self._encoded is None:
            self._encoded = encode_log_section(self.log.log_id_bytes, self.changesets, self.end_sqn)
        return self._encoded


class Uploads:
    """Every upload of this node, from start to completion.

    :meth:`start` marks the changesets uploading under one :class:`UploadTask`
    and queues it in its job's scheduler (created on first use; every job
    shares ``max_concurrent_uploads`` upload slots). When the task's future
    completes, :meth:`_complete` runs once: on success the writer keeps the
    handle entry for each changeset it still needs (open, not truncated past
    it) and the data is freed; on failure the changesets go back to
    not-uploaded (the next persist uploads them again) unless the writer was
    closed or truncated past them, which frees them. What is freed is
    released from the :class:`~dstl_server.throttle.MemoryBudget`.

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

    def start(self, wl: WriterLog, changesets: list[Changeset], *, preemptive: bool) -> UploadTask:
        """Upload ``changesets`` (taken out of not-uploaded, SQN order) as one log section."""
        fut: asyncio.Future[HandleEntry] = asyncio.get_running_loop().create_future()
        task = UploadTask(wl, changesets, preemptive, fut)
        for cs in changesets:
            wl.uploading[cs.sqn] = task
        self.running.add(task)
        fut.add_done_callback(lambda _: self._complete(task))
        self._scheduler(wl.job_id).submit(task)
        return task

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

    def preempt(self, wl: WriterLog) -> None:
        """Close the writer's changeset and upload all it has not uploaded, persist or not."""
        wl.rollover()
        changesets = wl.take_not_uploaded(None)
        if changesets:
            self.metrics.preemptive_uploads.inc()
            self.start(wl, changesets, preemptive=True)

    def flush_all(self, trigger: str) -> None:
        for sch in self._schedulers.values():
            sch.flush(trigger)

    def _complete(self, task: UploadTask) -> None:
        self.running.discard(task)
        fut = task.future
        entry = None if fut.cancelled() or fut.exception() is not None else fut.result()
        wl = task.log
        freed = 0
        for cs in task.changesets:
            if wl.uploading.get(cs.sqn) is task:
                del wl.uploading[cs.sqn]
            keep = not wl.closed and cs.sqn >= wl.truncated_before
            if entry is not None:
                freed += held_bytes(cs)
                if keep:
                    wl.uploaded[cs.sqn] = entry
            elif keep:
                wl.not_uploaded[cs.sqn] = cs
            else:
                freed += held_bytes(cs)
        self.budget.release(freed)

    def abandon(self, failure: DstlError) -> None:
        """Fail every running upload with ``failure`` (shutdown past its grace)."""
        for task in list(self.running):
            if not task.future.done():
                task.future.set_exception(failure)

    async def drain(self, timeout_s: float) -> bool:
        """Flush every queue and wait for running uploads; refuse new tasks."""
        results = await asyncio.gather(*(s.drain(timeout_s) for s in self._schedulers.values()))
        return all(results)


class BatchingScheduler:
    """Collects upload tasks of one job and flushes them into single objects.

    A flush takes every queued task and turns it into one object with one log
    section per task. It fires when (a) ``persist_delay_s`` has passed since
    the first task was queued, (b) queued bytes reach ``size_threshold``, or
    (c) everyone taking part in the job's flushes is in: every open writer
    of the job has a persist task queued and every child node known to
    forward for the job has forwarded (a parent thus waits for its
    children's batches instead of uploading its own without them, and a
    batch of the children leaves as soon as the last one arrives rather
    than after a persist delay per level). A child becomes known when it
    forwards and is forgotten after ``FORGET_AFTER_MISSES`` flushes in a
    row that had to wait for the delay without it (it stopped forwarding,
    or fell back to uploading itself), so a departed child costs at most
    that many delayed flushes, while a child that was on time is not
    forgotten because one delayed flush held only a straggler's section;
    at most ``MAX_TRACKED_CHILDREN`` are known per job. Flushed
    objects are uploaded concurrently, at most ``upload_slots`` at a time
    (shared by every job on the node). A flush that holds a persist's small
    sections and bulk sections (larger than :data:`BULK_SECTION_BYTES`)
    uploads them as two objects, the small one first; an object of more than
    that size also takes one of ``bulk_slots`` (one fewer than the upload
    slots), so bulk uploads never hold every upload slot. The queue also takes sections child
    nodes forwarded (:class:`ForwardedSection`, already encoded); with a
    ``forwarder`` (this node has a parent) a flush below its threshold goes
    to the parent first and is uploaded here only if that fails.

    Invariants: a task is in the queue or in exactly one flush; its future is
    completed exactly once, with the entry of a complete object or with an
    error. ``queued_bytes`` is the data size of the queued tasks, i.e. of the
    next object (the size trigger); memory is counted by the budget, not here.
    Event-loop only; :class:`Uploads` submits and flushes.
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
        bulk_slots: asyncio.Semaphore | None = None,
        open_writers: Callable[[], int],
        forwarder: ParentForwarder | None = None,
    ) -> None:
        self.job_id = job_id
        self.forwarder = forwarder
        self.persist_delay_s = persist_delay_s
        self.size_threshold = size_threshold
        self.uploader = uploader
        self.upload_slots = upload_slots
        self.bulk_slots = bulk_slots
        self.metrics = metrics
        self._open_writers = open_writers
        self._queue: list[Queued] = []
        self._queued_bytes = 0
        self._persisting: set[str] = set()
        #: children known to forward for this job (-> delayed flushes in a row
        #: without them), and those in the queue now
        self._children: dict[str, int] = {}
        self._arrived: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def submit(self, task: UploadTask) -> None:
        """Queue a task; flush now or arm the delay timer."""
        self.submit_many([task])

    def submit_many(self, tasks: Sequence[Queued], *, sender: str = "") -> None:
        """Queue tasks (all in the same next object); flush now or arm the delay timer.

        ``sender``: the child node that forwarded ``tasks`` ("" for local
        tasks or an unnamed child).
        """
        if self._closed:
            for task in tasks:
                task.future.set_exception(ShuttingDown("the sidecar is shutting down"))
            return
        for task in tasks:
            self._queue.append(task)
            nbytes = task.nbytes
            self._queued_bytes += nbytes
            if isinstance(task, UploadTask) and not task.preemptive:
                self._persisting.add(task.log.log_id)
                # a persist's small section is encoded now, in its call, while the
                # flush waits for the others; not a pre-emptive one (pressure relief
                # starts many at once) nor once the next object is large anyway
                if nbytes <= _EARLY_ENCODE_BYTES and self._queued_bytes <= _INLINE_BUILD_BYTES:
                    with contextlib.suppress(Exception):  # a failure shows at the flush
                        task.encode()
        if sender and (sender in self._children or len(self._children) < MAX_TRACKED_CHILDREN):
            self._children[sender] = 0
            self._arrived.add(sender)
        if self.persist_delay_s <= 0:
            self.flush("immediate")
        elif self._queued_bytes >= self.size_threshold:
            self.flush("size")
        elif self._all_in():
            self.flush("all_waiting")
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.persist_delay_s, self.flush, "delay")

    def _all_in(self) -> bool:
        """Every open writer of the job persisting and every known child arrived."""
        if not self._persisting and not self._arrived:
            return False  # only pre-emptive uploads or unnamed children queued
        return len(self._persisting) >= self._open_writers() and self._arrived.issuperset(
            self._children
        )

    def flush(self, trigger: str) -> None:
        """Take every queued task into one object and start its upload."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._queue:
            return
        if trigger == "delay":  # whoever kept the flush waiting: forgotten if it keeps doing so
            for child in [c for c in self._children if c not in self._arrived]:
                misses = self._children[child] + 1
                if misses >= FORGET_AFTER_MISSES:
                    del self._children[child]
                else:
                    self._children[child] = misses
        tasks, self._queue = self._queue, []
        self._queued_bytes = 0
        self._persisting.clear()
        self._arrived.clear()
        self.metrics.flushes.labels(trigger).inc()
        loop = asyncio.get_running_loop()
        for group in split_bulk(tasks):
            t = loop.create_task(self._upload(group))
            self._running.add(t)
            t.add_done_callback(self._running.discard)

    async def _upload(self, tasks: list[Queued]) -> None:
        nbytes = sum(t.nbytes for t in tasks)
        bulk = self.bulk_slots if nbytes > BULK_SECTION_BYTES else None
        async with bulk or contextlib.nullcontext():
            await self._upload_object(tasks, nbytes)

    async def _upload_object(self, tasks: list[Queued], nbytes: int) -> None:
        self.metrics.in_flight_bytes.inc(nbytes)
        try:
            # sections queued small are encoded already; what is left (large
            # sections) is encoded in a worker thread, past a size on the loop
            left = sum(t.nbytes for t in tasks if isinstance(t, UploadTask) and not t.encoded)
            forwarder = self.forwarder
            placed = None
            uploaded = True  # False: the parent placed the sections in its object
            if forwarder is None and left > _INLINE_ENCODE_BYTES:
                async with self.upload_slots:  # encoded and built in one thread hop
                    built = await asyncio.to_thread(_encode_and_build, tasks)
                    placed = (await self.uploader.upload(self.job_id, built.data), built.placements)
            else:
                if left > _INLINE_ENCODE_BYTES:
                    sections = await asyncio.to_thread(_encode, tasks)
                else:
                    sections = _encode(tasks)
                if forwarder is not None and forwarder.wants(_size(sections)):
                    placed = await forwarder.forward(self.job_id, sections)
                    uploaded = placed is None
                if placed is None:
                    async with self.upload_slots:
                        if _size(sections) <= _INLINE_BUILD_BYTES:
                            built = build_object(sections)
                        else:
                            built = await asyncio.to_thread(build_object, sections)
                        placed = (
                            await self.uploader.upload(self.job_id, built.data),
                            built.placements,
                        )
        except Exception as exc:
            err = exc if isinstance(exc, DstlError) else None
            reason = err.message if err else repr(exc)
            log.warning(
                "upload failed: %s",
                reason,
                extra={
                    "job_id": self.job_id,
                    "log_ids": sorted({t.log.log_id for t in tasks if isinstance(t, UploadTask)}),
                    "sections": len(tasks),
                },
            )
            failure = UploadFailed(f"upload for job {self.job_id} failed: {reason}")
            for t in tasks:
                if not t.future.done():
                    t.future.set_exception(failure)
            return
        finally:
            self.metrics.in_flight_bytes.dec(nbytes)
        if uploaded:  # not when the parent placed them: its object, its count
            self.metrics.logs_per_object.observe(len(tasks))
        children = sum(1 for t in tasks if isinstance(t, ForwardedSection))
        if children:
            self.metrics.forward_merged_sections.observe(children)
        key, placements = placed
        for t, (off, length) in zip(tasks, placements, strict=True):
            if not t.future.done():
                t.future.set_result(HandleEntry(key, off, length, t.first_sqn, t.end_sqn))

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


#: children a job's scheduler waits for at most; more still forward, unwaited for
MAX_TRACKED_CHILDREN = 256
#: delayed flushes in a row without a known child after which it is no longer waited for
FORGET_AFTER_MISSES = 2
#: longest ForwardRequest.sender accepted
MAX_SENDER_CHARS = 64

#: what a job's queue holds: a local writer's task or a child's forwarded section
Queued = UploadTask | ForwardedSection


def _encode(tasks: Sequence[Queued]) -> list[EncodedSection]:
    return [t.encode() for t in tasks]


def split_bulk(tasks: list[Queued]) -> list[list[Queued]]:
    """The objects of one flush: one, or the persists' small sections then the bulk ones."""
    small = [t for t in tasks if t.nbytes <= BULK_SECTION_BYTES]
    if len(small) == len(tasks) or not any(
        isinstance(t, UploadTask) and not t.preemptive for t in small
    ):
        return [tasks]
    return [small, [t for t in tasks if t.nbytes > BULK_SECTION_BYTES]]


def _encode_and_build(tasks: Sequence[Queued]) -> BuiltObject:
    """The object of ``tasks`` (a worker thread's one hop for a large flush)."""
    return build_object(_encode(tasks))


def _size(sections: Sequence[EncodedSection]) -> int:
    return sum(s.length for s in sections)
