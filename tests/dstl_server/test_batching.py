"""BatchingScheduler: one object per flush, its triggers, failures and shutdown."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from dstl_client.core.errors import ShuttingDown, UploadFailed
from dstl_client.core.format import Changeset, pack_changes, parse_kg_block, parse_log_header
from dstl_client.core.handle import HandleEntry
from dstl_server.batching import BatchingScheduler
from dstl_server.log import UploadTask, WriterLog
from dstl_server.metrics import ServerMetrics
from tests.dstl_server._fakes import MemoryUploader, sample

_sqns: dict[str, int] = {}


def make_task(wl: WriterLog, payload: bytes, *, preemptive: bool = False) -> UploadTask:
    """One changeset of ``payload`` for ``wl`` at its next SQN."""
    sqn = _sqns.get(wl.log_id, 0)
    _sqns[wl.log_id] = sqn + 1
    cs = Changeset(sqn, {wl.key_group_range[0]: [pack_changes([payload])]})
    fut: asyncio.Future[HandleEntry] = asyncio.get_running_loop().create_future()
    return UploadTask(wl, [cs], sqn + 1, cs.nbytes, preemptive, fut)


def scheduler(
    up: MemoryUploader,
    *,
    delay_s: float = 60.0,
    threshold: int = 1 << 20,
    writers: int | Callable[[], int] = 1,
    slots: asyncio.Semaphore | None = None,
    metrics: ServerMetrics | None = None,
    job: str = "job",
) -> BatchingScheduler:
    return BatchingScheduler(
        job,
        persist_delay_s=delay_s,
        size_threshold=threshold,
        uploader=up,
        upload_slots=slots or asyncio.Semaphore(4),
        metrics=metrics or ServerMetrics(),
        open_writers=writers if callable(writers) else (lambda: writers),
    )


def check_entry(up: MemoryUploader, task: UploadTask, entry: HandleEntry) -> bytes:
    """The entry points at ``task``'s section; returns the section's single change."""
    data = up.objects[entry.object_key]
    sec = data[entry.offset : entry.offset + entry.length]
    hdr = parse_log_header(sec, entry.length)
    assert hdr.log_id == task.log.log_id_bytes
    assert (hdr.first_sqn, hdr.end_sqn) == (entry.first_sqn, entry.end_sqn)
    assert (entry.first_sqn, entry.end_sqn) == (task.changesets[0].sqn, task.end_sqn)
    ((kg, (off, length)),) = hdr.key_groups.items()
    (view,) = parse_kg_block(kg, sec[off : off + length])
    (change,) = view.changes()
    return change


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


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


async def test_one_writer_persisting_twice_is_one_waiting_writer() -> None:
    up = MemoryUploader()
    sch = scheduler(up, writers=2)
    wl = WriterLog("job", "op", (0, 0))
    sch.submit(make_task(wl, b"a"))
    sch.submit(make_task(wl, b"b"))
    await settle()
    assert up.calls == 0


async def test_immediate_without_delay() -> None:
    up = MemoryUploader()
    metrics = ServerMetrics()
    sch = scheduler(up, writers=10, delay_s=0.0, metrics=metrics)
    t = make_task(WriterLog("job", "op", (0, 0)), b"now")
    sch.submit(t)
    await asyncio.wait_for(t.future, 5)
    assert sample(metrics, "dstl_flushes_total", trigger="immediate") == 1


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
