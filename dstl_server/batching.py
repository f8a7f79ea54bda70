"""A job's upload queue: tasks and forwarded sections batched into single objects.

:class:`BatchingScheduler` (one per job, made by
:class:`~dstl_server.uploads.Uploads`) collects what is to be uploaded and
flushes it into one object; the object is uploaded through the
:class:`~dstl_server.uploader.Uploader` (or placed by the parent node) and
every task's future completed with its entry or the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from dstl_client.core.errors import DstlError, ShuttingDown, UploadFailed
from dstl_client.core.format import BuiltObject, EncodedSection, build_object
from dstl_client.core.handle import HandleEntry
from dstl_server.flush_round import FORGET_AFTER_MISSES as FORGET_AFTER_MISSES  # re-exported
from dstl_server.flush_round import RoundMembers
from dstl_server.forwarder import ForwardedSection, ParentForwarder
from dstl_server.metrics import ServerMetrics
from dstl_server.upload_clock import Sleep
from dstl_server.upload_task import UploadingWriter, UploadTask
from dstl_server.uploader import Uploader

#: the upload lifecycle's logger (its name from before the queue had a module of its own)
log = logging.getLogger("dstl_server.uploads")

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


class BatchingScheduler:
    """Collects upload tasks of one job and flushes them into single objects.

    A flush takes every queued task and turns it into one object with one log
    section per task. It fires (trigger in ``dstl_flushes_total``) when

    * ``all_waiting``: everyone taking part is in: every open writer of the
      job has a persist queued (a persist that started no task, nothing new
      to upload, counts: :meth:`persist_queued`) and every child node known
      to forward for the job has forwarded (a parent thus waits for its
      children's batches instead of uploading its own without them, and a
      batch of the children leaves as soon as the last one arrives rather
      than after a persist delay per level);
    * ``size``: queued bytes reach ``size_threshold``;
    * ``delay``: ``persist_delay_s`` has passed since the first task was
      queued and no member of the round still owes its persist;
    * ``round``: past the delay, the last member that owed its persist
      arrived (open writers that never persist are not members);
    * ``max_wait``: ``max_wait_s`` has passed since the first task, members
      still owing (at or below the delay: no wait past it).

    "The round": persists do not reach the sidecar at once (64 writers' are
    spread over 17-22 ms on two busy cores, more than the 10 ms delay), so
    a fixed delay split a round into two objects. The members
    (:class:`~dstl_server.flush_round.RoundMembers`) are the writers and
    children that persisted or forwarded before; when one of them persists
    again, a round begins and every other member owes its persist, which the
    flush waits for past the delay (bounded by ``max_wait_s``). A member
    late past the maximum wait pays into the round that left without it (its
    late persist leaves at the delay, not waiting for the next round), one
    that still owed at ``FORGET_AFTER_MISSES`` timed flushes in a row (it
    stopped persisting or forwarding, or a child fell back to uploading
    itself) is forgotten, and a closed writer is dropped, so a departed
    member costs at most that many waits; newcomers are waited for from
    their second round. The wait past the delay costs nothing when every
    open writer persists: ``all_waiting`` leaves with the last of them, as
    before; 1 or 8 writers within the delay flush exactly as before.
    At most ``MAX_TRACKED_WRITERS`` writers and
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
        max_wait_s: float = 0.0,
        sleep: Sleep = asyncio.sleep,
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
        self.max_wait_s = max_wait_s
        self._sleep = sleep
        #: writers with a persist in the queue now, children whose batch is in it
        self._persisting: set[str] = set()
        self._arrived: set[str] = set()
        #: who takes part in the job's rounds, and who still owes the current one
        self._round = RoundMembers(
            max_writers=MAX_TRACKED_WRITERS, max_children=MAX_TRACKED_CHILDREN
        )
        #: the queue's timer: the delay, then possibly the wait for the round
        self._timer: asyncio.Task[None] | None = None
        #: the timer passed the delay and waits for the members still owing
        self._extended = False
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
                self._round.writer_arrives(task.log.log_id, task.log)
                # a persist's small section is encoded now, in its call, while the
                # flush waits for the others; not a pre-emptive one (pressure relief
                # starts many at once) nor once the next object is large anyway
                if nbytes <= _EARLY_ENCODE_BYTES and self._queued_bytes <= _INLINE_BUILD_BYTES:
                    with contextlib.suppress(Exception):  # a failure shows at the flush
                        task.encode()
        if sender:
            self._round.child_arrives(sender)
            if sender in self._round.children:
                self._arrived.add(sender)
        self._schedule()

    def persist_queued(self, writer: UploadingWriter) -> None:
        """``writer`` persisted and its persist started no task (nothing new, or
        its changes already in a queued or running upload): it waits for the
        flush like a writer whose task is queued, and it has paid its round."""
        if self._closed:
            return
        self._round.writer_arrives(writer.log_id, writer)
        if self._queue:  # it waits for this flush: it counts among those in
            self._persisting.add(writer.log_id)
            self._schedule()

    def _schedule(self) -> None:
        """After an arrival: flush now, or arm the timer."""
        if self.persist_delay_s <= 0:
            self.flush("immediate")
        elif self._queued_bytes >= self.size_threshold:
            self.flush("size")
        elif self._all_in():
            self.flush("all_waiting")
        elif self._extended and not self._round.missing():
            self.flush("round")
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._timed_flush())

    def _all_in(self) -> bool:
        """Every open writer of the job persisting and every known child arrived."""
        if not self._persisting and not self._arrived:
            return False  # only pre-emptive uploads or unnamed children queued
        return len(self._persisting) >= self._open_writers() and self._arrived.issuperset(
            self._round.children
        )

    async def _timed_flush(self) -> None:
        """The queue's timer: flush at the persist delay, unless members of the
        round still owe their persist; then at the round's last arrival
        (:meth:`_schedule`) or at ``max_wait_s`` after the first task."""
        await self._sleep(self.persist_delay_s)
        trigger = "delay"
        if self.max_wait_s > self.persist_delay_s and self._round.missing():
            self._extended = True
            await self._sleep(self.max_wait_s - self.persist_delay_s)
            trigger = "max_wait"
        self._timer = None  # this task ends here: flush must not cancel it
        self.flush(trigger)

    def flush(self, trigger: str) -> None:
        """Take every queued task into one object and start its upload."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._extended = False
        if not self._queue:
            return
        if trigger in ("delay", "max_wait"):  # whoever kept it waiting: forgotten if it keeps on
            self._round.waited()
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
#: writers a job's scheduler waits for past the delay at most (the registry
#: bounds a job's open writers by ``max_writers_per_job``, 1024 by default)
MAX_TRACKED_WRITERS = 4096
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
