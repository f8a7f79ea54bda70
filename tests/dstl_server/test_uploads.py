"""dstl_server.uploads: an upload's lifecycle, from start to completion, and its batching.

The first part drives :class:`Uploads` (start, completion, what the budget
gets back) with uploads completed by hand; the second the per-job
:class:`BatchingScheduler`: one object per flush, its triggers, failures and
shutdown.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from dstl_client.core.errors import ShuttingDown, SqnOutOfRange, UploadFailed
from dstl_client.core.format import pack_changes
from dstl_client.core.handle import HandleEntry
from dstl_server.batching import BULK_SECTION_BYTES, FORGET_AFTER_MISSES, BatchingScheduler
from dstl_server.forwarder import ForwardedSection
from dstl_server.log import PART_OVERHEAD_BYTES, WriterLog
from dstl_server.metrics import ServerMetrics
from dstl_server.throttle import MemoryBudget
from dstl_server.upload_task import UploadTask
from dstl_server.uploads import Uploads
from tests.dstl_server._helpers import check_entry, make_task, scheduler
from tests.fakes import MemoryUploader, sample, settings, settle

# ---------------------------------------------------------------- lifecycle


class Node:
    """Uploads and the budget as the registry holds them, for hand-completed uploads.

    Nothing flushes by itself here (a minute's persist delay, one of two
    writers persisting), so each test completes its uploads with
    :func:`complete`.
    """

    def __init__(self) -> None:
        self.budget = MemoryBudget(1 << 40, 1.0, lambda: None)
        self.uploads = Uploads(
            settings(persist_delay_ms=60_000.0),
            MemoryUploader(),
            ServerMetrics(),
            self.budget,
            open_writers=lambda job_id: 2,
        )

    async def add(self, wl: WriterLog, kg: int, *changes: bytes) -> int:
        """Append one part as the registry does; return what the budget was charged."""
        packed = pack_changes(list(changes))
        n = packed.nbytes + PART_OVERHEAD_BYTES
        await self.budget.acquire(n)
        wl.append(kg, packed)
        return n

    def start(self, wl: WriterLog, after: int | None = None) -> UploadTask:
        return self.uploads.start(wl, wl.take_not_uploaded(after), preemptive=False)


def new_log() -> WriterLog:
    return WriterLog("job", "op", (4, 7))


def entry(task: UploadTask, key: str = "job/00/k") -> HandleEntry:
    return HandleEntry(key, 16, 100, task.changesets[0].sqn, task.end_sqn)


async def complete(task: UploadTask, result: HandleEntry | None) -> None:
    """End ``task``'s upload as the scheduler would (``None``: it failed); wait for its completion."""
    if result is None:
        task.future.set_exception(UploadFailed("injected upload failure"))
    else:
        task.future.set_result(result)
    ran = asyncio.Event()
    task.future.add_done_callback(lambda _: ran.set())  # runs after the completion callback
    await ran.wait()


@pytest.mark.asyncio
async def test_upload_success_frees_data_and_keeps_the_entry() -> None:
    node, wl = Node(), new_log()
    nbytes = await node.add(wl, 4, b"abc")
    wl.rollover()
    nbytes += await node.add(wl, 5, b"de")
    wl.rollover()
    task = node.start(wl)
    assert sorted(wl.uploading) == [0, 1] and not wl.not_uploaded
    assert wl.sections_from(0) == [task]  # one task covering two SQNs, listed once
    assert node.budget.used == nbytes and task in node.uploads.running
    e = entry(task)
    await complete(task, e)
    assert node.budget.used == 0  # all of it freed
    assert task not in node.uploads.running
    assert wl.uploaded == {0: e, 1: e} and not wl.uploading
    assert wl.sections_from(0) == [e]
    assert wl.sections_from(1) == [e]
    assert wl.sections_from(2) == []


@pytest.mark.asyncio
async def test_upload_failure_returns_changesets() -> None:
    node, wl = Node(), new_log()
    nbytes = await node.add(wl, 4, b"abc")
    wl.rollover()
    task = node.start(wl)
    await complete(task, None)
    assert sorted(wl.not_uploaded) == [0] and not wl.uploading
    assert node.budget.used == nbytes  # nothing freed: the changes are kept


@pytest.mark.asyncio
async def test_upload_failure_after_truncate_or_close_frees() -> None:
    node, wl = Node(), new_log()
    nbytes = await node.add(wl, 4, b"abc")
    wl.rollover()
    later = await node.add(wl, 4, b"later")
    wl.rollover()
    task = node.start(wl, after=0)
    node.budget.release(wl.truncate(1))  # SQN 0 is no longer needed, SQN 1 is
    assert node.budget.used == nbytes + later  # both still held by the upload
    await complete(task, None)
    assert node.budget.used == later  # SQN 0 freed
    assert sorted(wl.not_uploaded) == [1]

    node2, wl2 = Node(), new_log()
    n2 = await node2.add(wl2, 4, b"x")
    wl2.rollover()
    task2 = node2.start(wl2)
    assert wl2.close() == 0  # the uploading bytes are not freed by close...
    assert node2.budget.used == n2
    await complete(task2, None)
    assert node2.budget.used == 0  # ...but when the upload ends
    assert not wl2.not_uploaded


@pytest.mark.asyncio
async def test_sections_mix_uploaded_and_uploading_in_sqn_order() -> None:
    node, wl = Node(), new_log()
    await node.add(wl, 4, b"a")
    wl.rollover()
    t1 = node.start(wl)
    e1 = entry(t1, "job/00/one")
    await complete(t1, e1)
    await node.add(wl, 4, b"b")
    wl.rollover()
    await node.add(wl, 4, b"c")
    wl.rollover()
    t2 = node.start(wl)
    assert wl.sections_from(0) == [e1, t2]
    assert wl.sections_from(1) == [t2]
    assert wl.sections_from(2) == [t2]  # t2 holds SQN 1 and 2: the reader filters SQN 1


@pytest.mark.asyncio
async def test_truncate_after_an_upload() -> None:
    node, wl = Node(), new_log()
    n0 = await node.add(wl, 4, b"zero")
    wl.rollover()
    t = node.start(wl)
    await complete(t, entry(t))
    n1 = await node.add(wl, 4, b"one")
    wl.rollover()
    n2 = await node.add(wl, 4, b"two")
    assert node.budget.used == n1 + n2 and n0
    with pytest.raises(SqnOutOfRange):
        wl.truncate(3)
    freed = wl.truncate(2)
    assert freed == n1  # active changeset 2 stays
    node.budget.release(freed)
    assert not wl.uploaded and not wl.not_uploaded
    assert node.budget.used == n2 and wl.truncated_before == 2
    assert wl.truncate(2) == 0
    assert wl.truncate(1) == 0  # going back is a no-op
    assert wl.truncated_before == 2


@pytest.mark.asyncio
async def test_successful_upload_after_close_keeps_no_reference() -> None:
    node, wl = Node(), new_log()
    await node.add(wl, 4, b"x")
    wl.rollover()
    t = node.start(wl)
    node.budget.release(wl.close())
    await complete(t, entry(t))
    assert wl.uploaded == {} and node.budget.used == 0


@pytest.mark.asyncio
async def test_abandon_fails_every_running_upload() -> None:
    node, wl = Node(), new_log()
    n = await node.add(wl, 4, b"x")
    wl.rollover()
    t = node.start(wl)
    ran = asyncio.Event()
    t.future.add_done_callback(lambda _: ran.set())
    node.uploads.abandon(ShuttingDown("stopped"))
    await ran.wait()
    with pytest.raises(ShuttingDown, match="stopped"):
        t.future.result()
    assert not node.uploads.running
    assert sorted(wl.not_uploaded) == [0] and node.budget.used == n  # kept, as any failure


# ---------------------------------------------------------------- batching


@pytest.mark.asyncio
async def test_one_object_per_flush() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=5, metrics=metrics)
    logs = [WriterLog("job", f"op{i}", (i, i)) for i in range(5)]
    tasks = [make_task(wl, f"data of {i}".encode() * (i + 1)) for i, wl in enumerate(logs)]
    for t in tasks:
        sch.submit(t)
    assert sch.queued_bytes == 0  # the fifth persisting writer flushed the queue
    entries = [await asyncio.wait_for(t.future, 5) for t in tasks]
    assert up.calls == 1
    assert len({e.object_key for e in entries}) == 1
    for i, (t, e) in enumerate(zip(tasks, entries, strict=True)):
        assert check_entry(up, t, e) == f"data of {i}".encode() * (i + 1)
    assert sample(metrics, "dstl_flushes_total", trigger="all_waiting") == 1
    assert sample(metrics, "dstl_upload_logs_per_object_sum") == 5


@pytest.mark.asyncio
async def test_several_tasks_of_one_writer_in_one_object() -> None:
    up = MemoryUploader()
    sch = scheduler(up, writers=2, delay_s=0.01)
    wl = WriterLog("job", "op", (0, 0))
    t1 = make_task(wl, b"first", preemptive=True)
    t2 = make_task(wl, b"second")
    sch.submit(t1)
    sch.submit(t2)
    e1, e2 = await asyncio.wait_for(asyncio.gather(t1.future, t2.future), 5)
    assert e1.object_key == e2.object_key and e1.offset < e2.offset
    assert check_entry(up, t1, e1) == b"first"
    assert check_entry(up, t2, e2) == b"second"


@pytest.mark.asyncio
async def test_delay_trigger() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=2, delay_s=0.1, metrics=metrics)
    wl = WriterLog("job", "op", (0, 0))
    t = make_task(wl, b"x")
    started = time.monotonic()
    sch.submit(t)
    await settle()
    assert up.calls == 0 and sch.queued_bytes == t.nbytes
    await asyncio.wait_for(t.future, 5)
    assert time.monotonic() - started >= 0.09
    assert sample(metrics, "dstl_flushes_total", trigger="delay") == 1
    assert sample(metrics, "dstl_flushes_total", trigger="all_waiting") == 0


@pytest.mark.asyncio
async def test_timer_restarts_with_the_next_batch() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=3, delay_s=0.05, metrics=metrics)
    wl = WriterLog("job", "op", (0, 0))
    for _ in range(2):
        t = make_task(wl, b"x")
        sch.submit(t)
        await asyncio.wait_for(t.future, 5)
    assert sample(metrics, "dstl_flushes_total", trigger="delay") == 2
    assert up.calls == 2


@pytest.mark.asyncio
async def test_size_trigger() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=10, threshold=1000, metrics=metrics)
    wl = WriterLog("job", "op", (0, 0))
    small = make_task(wl, b"s" * 400, preemptive=True)
    sch.submit(small)
    await settle()
    assert up.calls == 0
    big = make_task(wl, b"b" * 600, preemptive=True)  # 404 + 604 bytes >= 1000
    sch.submit(big)
    await asyncio.wait_for(asyncio.gather(small.future, big.future), 5)
    assert up.calls == 1
    assert sample(metrics, "dstl_flushes_total", trigger="size") == 1


@pytest.mark.asyncio
async def test_preemptive_tasks_do_not_count_as_waiting_writers() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=2, metrics=metrics)
    w1 = WriterLog("job", "op1", (0, 0))
    w2 = WriterLog("job", "op2", (0, 0))
    sch.submit(make_task(w1, b"pre", preemptive=True))
    sch.submit(make_task(w2, b"pre", preemptive=True))
    await settle()
    assert up.calls == 0  # two writers have data queued, but nobody asked to persist
    p1 = make_task(w1, b"persist")
    sch.submit(p1)
    await settle()
    assert up.calls == 0  # one of two writers waits
    p2 = make_task(w2, b"persist")
    sch.submit(p2)
    await asyncio.wait_for(asyncio.gather(p1.future, p2.future), 5)
    assert up.calls == 1
    assert sample(metrics, "dstl_flushes_total", trigger="all_waiting") == 1


@pytest.mark.asyncio
async def test_one_writer_persisting_twice_is_one_waiting_writer() -> None:
    up = MemoryUploader()
    sch = scheduler(up, writers=2)
    wl = WriterLog("job", "op", (0, 0))
    sch.submit(make_task(wl, b"a"))
    sch.submit(make_task(wl, b"b"))
    await settle()
    assert up.calls == 0


@pytest.mark.asyncio
async def test_immediate_without_delay() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=10, delay_s=0.0, metrics=metrics)
    t = make_task(WriterLog("job", "op", (0, 0)), b"now")
    sch.submit(t)
    await asyncio.wait_for(t.future, 5)
    assert sample(metrics, "dstl_flushes_total", trigger="immediate") == 1


def forwarded(payload: bytes) -> ForwardedSection:
    """A child's section, as a parent's Forward handler queues it."""
    section = make_task(WriterLog("job", "child-op", (0, 0)), payload).encode()
    return ForwardedSection(section, asyncio.get_running_loop().create_future())


@pytest.mark.asyncio
async def test_a_parent_waits_for_its_known_children_before_flushing() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=1, metrics=metrics)
    wl = WriterLog("job", "op", (0, 0))
    # round 1: the child forwards while the parent's writer is busy, then it persists
    c1 = forwarded(b"child r1")
    sch.submit_many([c1], sender="c")
    await settle()
    assert up.calls == 0
    p1 = make_task(wl, b"parent r1")
    sch.submit(p1)
    await asyncio.wait_for(asyncio.gather(c1.future, p1.future), 5)
    assert up.calls == 1
    # round 2: the parent's writer persists first; all its own writers wait, but
    # the known child has not forwarded yet: no object without it
    p2 = make_task(wl, b"parent r2")
    sch.submit(p2)
    await settle()
    assert up.calls == 1 and not p2.future.done()
    c2 = forwarded(b"child r2")
    sch.submit_many([c2], sender="c")
    e1, e2 = await asyncio.wait_for(asyncio.gather(p2.future, c2.future), 5)
    assert up.calls == 2 and e1.object_key == e2.object_key
    assert sample(metrics, "dstl_flushes_total", trigger="all_waiting") == 2
    assert sample(metrics, "dstl_flushes_total", trigger="delay") == 0


async def forward_round(sch: BatchingScheduler, *senders: str) -> list[HandleEntry]:
    """Each sender forwards one section, one after the other; their entries."""
    sections = []
    for name in senders:
        s = forwarded(name.encode())
        sch.submit_many([s], sender=name)
        sections.append(s)
        await settle()
    return list(await asyncio.wait_for(asyncio.gather(*(s.future for s in sections)), 5))


@pytest.mark.asyncio
async def test_children_batches_leave_when_the_last_child_arrives() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=0, delay_s=0.05, metrics=metrics)  # no writers of its own
    # the first round learns who forwards: a leaves at once, b waits for a known a
    await forward_round(sch, "a", "b")
    assert up.calls == 2
    assert sample(metrics, "dstl_flushes_total", trigger="delay") == 1
    # from then on a waits for b, and the batch leaves when b arrives
    a, b = forwarded(b"a"), forwarded(b"b")
    sch.submit_many([a], sender="a")
    await settle()
    assert up.calls == 2 and not a.future.done()
    sch.submit_many([b], sender="b")
    ea, eb = await asyncio.wait_for(asyncio.gather(a.future, b.future), 5)
    assert up.calls == 3 and ea.object_key == eb.object_key
    assert sample(metrics, "dstl_flushes_total", trigger="delay") == 1
    entries = await forward_round(sch, "b", "a")  # in either order
    assert up.calls == 4 and len({e.object_key for e in entries}) == 1


@pytest.mark.asyncio
async def test_a_departed_child_costs_two_delayed_flushes() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=0, delay_s=0.05, metrics=metrics)
    await forward_round(sch, "a", "b")
    await forward_round(sch, "a", "b")  # both known now
    delayed = sample(metrics, "dstl_flushes_total", trigger="delay")
    # b stopped forwarding: a's next two flushes wait the delay, then b is forgotten
    for _ in range(4):
        await forward_round(sch, "a")
    assert sample(metrics, "dstl_flushes_total", trigger="delay") == delayed + FORGET_AFTER_MISSES
    assert up.calls == 2 + 1 + 4
    # an unnamed child is never waited for: it rides along with the next flush
    s = forwarded(b"anonymous")
    sch.submit_many([s])
    await settle()
    assert not s.future.done()
    (ea,) = await forward_round(sch, "a")
    assert (await s.future).object_key == ea.object_key


@pytest.mark.asyncio
async def test_a_delayed_flush_of_a_straggler_alone_does_not_forget_the_on_time_children() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=1, delay_s=0.05, metrics=metrics)
    wl = WriterLog("job", "op", (0, 0))

    async def together() -> list[HandleEntry]:
        """The parent's writer and child c, in either order: one object."""
        p = make_task(wl, b"p")
        sch.submit(p)
        await settle()
        assert not p.future.done()  # waits for c
        c = forwarded(b"c")
        sch.submit_many([c], sender="c")
        return list(await asyncio.wait_for(asyncio.gather(p.future, c.future), 5))

    c = forwarded(b"c")
    sch.submit_many([c], sender="c")  # c becomes known (waits for the writer)
    p = make_task(wl, b"p")
    sch.submit(p)
    await asyncio.wait_for(asyncio.gather(c.future, p.future), 5)
    # a late persist of the writer, after the round left: it waits the delay alone
    late = make_task(wl, b"late")
    sch.submit(late)
    await asyncio.wait_for(late.future, 5)
    assert sample(metrics, "dstl_flushes_total", trigger="delay") == 1
    # c was on time: the next rounds still wait for it, one object each
    for _ in range(2):
        calls = up.calls
        e1, e2 = await together()
        assert up.calls == calls + 1 and e1.object_key == e2.object_key
    assert sample(metrics, "dstl_flushes_total", trigger="delay") == 1


@pytest.mark.asyncio
async def test_flush_of_an_empty_queue_does_nothing() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, metrics=metrics)
    sch.flush("pressure")
    await settle()
    assert up.calls == 0
    assert sample(metrics, "dstl_flushes_total", trigger="pressure") == 0


@pytest.mark.parametrize(
    ("failure", "reason"),
    [("transient", "injected upload failure"), ("bug", "RuntimeError('boom')")],
)
@pytest.mark.asyncio
async def test_failed_upload_fails_every_task(failure: str, reason: str) -> None:
    up = MemoryUploader()
    if failure == "transient":
        up.fail_next = 1
    else:

        async def broken(job_id: str, data: bytes) -> str:
            up.calls += 1
            raise RuntimeError("boom")

        up.upload = broken  # type: ignore[method-assign]
    sch = scheduler(up, writers=2)
    tasks = [make_task(WriterLog("job", f"op{i}", (0, 0)), b"x") for i in range(2)]
    for t in tasks:
        sch.submit(t)
    for t in tasks:
        with pytest.raises(UploadFailed, match=reason.replace("(", r"\(").replace(")", r"\)")):
            await asyncio.wait_for(t.future, 5)
    assert up.calls == 1


@pytest.mark.asyncio
async def test_failure_does_not_stick() -> None:
    up = MemoryUploader()
    up.fail_next = 1
    sch = scheduler(up)
    wl = WriterLog("job", "op", (0, 0))
    t1 = make_task(wl, b"x")
    sch.submit(t1)
    with pytest.raises(UploadFailed):
        await asyncio.wait_for(t1.future, 5)
    t2 = make_task(wl, b"y")
    sch.submit(t2)
    assert check_entry(up, t2, await asyncio.wait_for(t2.future, 5)) == b"y"


@pytest.mark.asyncio
async def test_upload_slots_bound_concurrency_across_jobs() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    slots = asyncio.Semaphore(2)
    metrics = ServerMetrics()
    scheds = [scheduler(up, slots=slots, job=f"job{i}", metrics=metrics) for i in range(4)]
    tasks = []
    for i, sch in enumerate(scheds):
        t = make_task(WriterLog(f"job{i}", "op", (0, 0)), b"z" * 100)
        tasks.append(t)
        sch.submit(t)
    await settle()
    assert up.running == 2  # two objects upload, two wait for a slot
    # bytes of every flushed object count as in flight, waiting or uploading
    assert sample(metrics, "dstl_upload_in_flight_bytes") == 4 * tasks[0].nbytes
    up.gate.set()
    await asyncio.wait_for(asyncio.gather(*(t.future for t in tasks)), 5)
    assert up.max_running == 2 and up.calls == 4
    assert sorted(up.jobs) == ["job0", "job1", "job2", "job3"]
    assert sample(metrics, "dstl_upload_in_flight_bytes") == 0


@pytest.mark.asyncio
async def test_large_object_is_encoded_off_the_loop() -> None:
    up = MemoryUploader()
    sch = scheduler(up, writers=3)
    payloads = [bytes([i]) * (200 * 1024) for i in range(3)]  # 600 KiB object
    tasks = [make_task(WriterLog("job", f"op{i}", (0, 0)), p) for i, p in enumerate(payloads)]
    for t in tasks:
        sch.submit(t)
    entries = await asyncio.wait_for(asyncio.gather(*(t.future for t in tasks)), 5)
    for t, e, p in zip(tasks, entries, payloads, strict=True):
        assert check_entry(up, t, e) == p


@pytest.mark.asyncio
async def test_drain_flushes_waits_and_refuses() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=2, metrics=metrics)
    wl = WriterLog("job", "op", (0, 0))
    queued = make_task(wl, b"queued")
    sch.submit(queued)
    await settle()
    assert up.calls == 0
    drain = asyncio.create_task(sch.drain(5.0))
    await settle()
    assert up.calls == 1 and not drain.done()
    assert sample(metrics, "dstl_flushes_total", trigger="shutdown") == 1
    late = make_task(wl, b"late")
    sch.submit(late)
    with pytest.raises(ShuttingDown):
        await late.future
    up.gate.set()
    assert await drain is True
    assert check_entry(up, queued, queued.future.result()) == b"queued"
    sch.reopen()
    again = make_task(wl, b"again")
    sch.submit(again)
    sch.flush("manual")
    assert check_entry(up, again, await asyncio.wait_for(again.future, 5)) == b"again"


@pytest.mark.asyncio
async def test_drain_times_out_on_a_stuck_upload() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    sch = scheduler(up)
    t = make_task(WriterLog("job", "op", (0, 0)), b"stuck")
    sch.submit(t)
    await settle()
    assert await sch.drain(0.05) is False
    up.gate.set()  # let the upload task end before the loop closes
    await asyncio.wait_for(t.future, 5)
    assert await sch.drain(1.0) is True


# ------------------------------------------------------------- bulk sections


class BulkGatedUploader(MemoryUploader):
    """Holds uploads of objects larger than a bulk section until :attr:`bulk_gate` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.bulk_gate = asyncio.Event()
        self.bulk_started = 0

    async def upload(self, job_id: str, data: bytes) -> str:
        if len(data) > BULK_SECTION_BYTES:
            self.bulk_started += 1
            self._moved()
            await self.bulk_gate.wait()
        return await super().upload(job_id, data)


@pytest.mark.asyncio
async def test_a_persist_does_not_wait_for_a_bulk_section_in_its_flush() -> None:
    up = BulkGatedUploader()
    sch = scheduler(up, writers=2, threshold=64 << 20)
    mat = make_task(
        WriterLog("job", "op.mat", (0, 0)), b"M" * (BULK_SECTION_BYTES + 1), preemptive=True
    )
    small = make_task(WriterLog("job", "op", (1, 1)), b"changes of a checkpoint")
    sch.submit(mat)
    sch.submit(small)
    sch.flush("delay")
    # the small persist's object is uploaded while the bulk one is held
    entry = await asyncio.wait_for(small.future, 5)
    assert check_entry(up, small, entry) == b"changes of a checkpoint"
    await up.until(lambda: up.bulk_started == 1)
    assert not mat.future.done()  # held: the persist did not wait for it
    up.bulk_gate.set()
    bulk_entry = await asyncio.wait_for(mat.future, 5)
    assert bulk_entry.object_key != entry.object_key
    assert check_entry(up, mat, bulk_entry) == b"M" * (BULK_SECTION_BYTES + 1)


@pytest.mark.asyncio
async def test_without_a_persist_a_flush_stays_one_object() -> None:
    up = MemoryUploader()
    sch = scheduler(up, writers=3, threshold=64 << 20)
    big = make_task(WriterLog("job", "a", (0, 0)), b"B" * (BULK_SECTION_BYTES + 1), preemptive=True)
    little = make_task(WriterLog("job", "b", (1, 1)), b"b", preemptive=True)
    sch.submit(big)
    sch.submit(little)
    sch.flush("delay")
    e1, e2 = await asyncio.wait_for(asyncio.gather(big.future, little.future), 5)
    assert e1.object_key == e2.object_key and up.calls == 1


@pytest.mark.asyncio
async def test_bulk_uploads_leave_an_upload_slot_to_persists() -> None:
    up = BulkGatedUploader()
    slots, bulk = asyncio.Semaphore(2), asyncio.Semaphore(1)
    sch = BatchingScheduler(
        "job",
        persist_delay_s=60.0,
        size_threshold=64 << 20,
        uploader=up,
        upload_slots=slots,
        bulk_slots=bulk,
        metrics=ServerMetrics(),
        open_writers=lambda: 3,
    )
    bulks = [
        make_task(
            WriterLog("job", f"m{i}", (i, i)), b"M" * (BULK_SECTION_BYTES + 1), preemptive=True
        )
        for i in range(2)
    ]
    for t in bulks:  # two flushes of bulk sections only
        sch.submit(t)
        sch.flush("size")
    await up.until(lambda: up.bulk_started == 1)
    small = make_task(WriterLog("job", "op", (5, 5)), b"persist")
    sch.submit(small)
    sch.flush("delay")
    await asyncio.wait_for(small.future, 5)  # the second slot was free for it
    assert up.bulk_started == 1  # the second bulk object waits for the bulk slot
    up.bulk_gate.set()
    await asyncio.wait_for(asyncio.gather(*(t.future for t in bulks)), 5)
    assert up.bulk_started == 2
