"""LogRegistry: the FLIP-158 writer contract over a fake in-memory uploader."""

from __future__ import annotations

import asyncio
import time

import pytest

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    Backpressure,
    BudgetFull,
    ChangeTooLarge,
    InvalidArgument,
    KeyGroupOutOfRange,
    LogNotFound,
    ShuttingDown,
    SqnOutOfRange,
    TooManyWriters,
    UploadFailed,
    WriterClosed,
)
from dstl_client.core.format import PackedChanges, pack_changes, parse_object
from dstl_client.core.handle import ChangelogHandle
from dstl_server.log import PART_OVERHEAD_BYTES
from tests.fakes import MemoryUploader, batch, part, read_handle, registry, sample, settle

LONG_DELAY_MS = 60_000.0  # a flush that waits for this never happens within a test


def charged(*changes: bytes) -> int:
    """Budget bytes of one appended part holding ``changes``: packed bytes + part overhead."""
    return pack_changes(list(changes)).nbytes + PART_OVERHEAD_BYTES


# ---------------------------------------------------------------- lifecycle


@pytest.mark.asyncio
async def test_flip158_state_change_lifecycle() -> None:
    """Seed 000, "State change lifecycle", step by step."""
    up = MemoryUploader()
    up.gate = asyncio.Event()  # CP1's upload is still running when CP2 starts
    reg = registry(up)
    wl = reg.create_writer("job", "list-state-op", (0, 127))
    lid = wl.log_id

    # On startup the state is empty: StateChangelog.sqn = T0, lastMaterializedSqn = T0
    t0 = await reg.last_appended_sqn(lid)
    assert t0 == 0
    assert await reg.append(lid, batch((7, [b"a"]))) == t0  # a change gets the active SQN

    # CP1: persistDurably(after = T0); StateChangelog.sqn = T1; upload of (T0:T1 = a)
    cp1_task = asyncio.create_task(reg.persist(lid, after=t0))
    await up.until(lambda: up.calls == 1)
    t1 = wl.active_sqn
    assert t1 == 1

    # Materialization: the backend obtains the SQN (T2) after appending b
    assert await reg.append(lid, batch((7, [b"b"]))) == t1
    t2 = await reg.last_appended_sqn(lid)
    assert t2 == 2
    assert await reg.last_appended_sqn(lid) == t2  # asking again without changes: same SQN
    await reg.append(lid, batch((8, [b"c"])))

    # CP2: persistDurably(after = T0): combines CP1's running upload with (T1:T3 = b,c)
    cp2_task = asyncio.create_task(reg.persist(lid, after=t0))
    await up.until(lambda: up.calls == 2)
    assert not cp1_task.done() and not cp2_task.done()
    up.gate.set()
    cp1 = await cp1_task
    cp2 = await cp2_task
    t3 = cp2.to_sqn
    assert (cp1.from_sqn, cp1.to_sqn) == (t0, t1)
    assert (cp2.from_sqn, t3) == (t0, 3)
    assert len(cp1.entries) == 1 and len(cp2.entries) == 2
    assert cp2.entries[0] == cp1.entries[0]  # the same upload, not a second copy of a
    a_entry, bc_entry = cp2.entries
    assert (a_entry.first_sqn, a_entry.end_sqn) == (t0, t1)
    assert (bc_entry.first_sqn, bc_entry.end_sqn) == (t1, t3)
    assert a_entry.object_key != bc_entry.object_key  # "a combined handle pointing to two files"
    assert up.calls == 2
    assert await read_handle(up, cp1) == [(7, 0, [b"a"])]
    assert await read_handle(up, cp2) == [(7, 0, [b"a"]), (7, 1, [b"b"]), (8, 2, [b"c"])]

    # Materialization completes: lastMaterializedSqn = T2; truncate(before = T2)
    objects_before = dict(up.objects)
    await reg.truncate(lid, before=t2)
    assert up.objects == objects_before  # nothing a handle references is deleted
    assert await read_handle(up, cp2) == [(7, 0, [b"a"]), (7, 1, [b"b"]), (8, 2, [b"c"])]
    assert sorted(wl.uploaded) == [2]  # only the reference to (T1:T3) is still needed

    # CP3: persistDurably(after = T2) -> handle (T2:T4): reuses (T1:T3 = b,c) plus (T3:T4 = d)
    await reg.append(lid, batch((7, [b"d"])))
    cp3 = await reg.persist(lid, after=t2)
    t4 = cp3.to_sqn
    assert (cp3.from_sqn, t4) == (t2, 4)
    assert cp3.entries[0] == bc_entry
    assert (cp3.entries[1].first_sqn, cp3.entries[1].end_sqn) == (t3, t4)
    assert up.calls == 3
    # recovery: b (SQN T1) is in the reused section but filtered by the handle's range
    assert await read_handle(up, cp3) == [(8, 2, [b"c"]), (7, 3, [b"d"])]
    assert await read_handle(up, cp3, [7]) == [(7, 3, [b"d"])]
    # the section itself does hold b: the filter is what hides it
    unfiltered = ChangelogHandle("job", lid, (0, 127), t1, t4, cp3.entries)
    assert (7, 1, [b"b"]) in await read_handle(up, unfiltered)
    assert reg.budget.used == 0


# ---------------------------------------------------------------- SQNs


@pytest.mark.asyncio
async def test_sqns_increase_only_when_a_changeset_closes() -> None:
    reg = registry(MemoryUploader())
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    assert await reg.last_appended_sqn(lid) == 0
    assert await reg.append(lid, batch((0, [b"x"]))) == 0
    assert await reg.append(lid, batch((1, [b"y"]))) == 0  # same changeset
    assert await reg.last_appended_sqn(lid) == 1
    assert await reg.last_appended_sqn(lid) == 1
    assert await reg.append(lid, batch((0, [b"z"]))) == 1
    assert await reg.last_appended_sqn(lid) == 2


@pytest.mark.asyncio
async def test_persist_with_nothing_appended() -> None:
    up = MemoryUploader()
    reg = registry(up)
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    h = await reg.persist(lid, after=0)
    assert (h.from_sqn, h.to_sqn, h.entries) == (0, 0, ())
    assert up.calls == 0
    await reg.append(lid, batch((1, [b"x"])))
    first = await reg.persist(lid, after=0)
    # persisting from the end of what was persisted: nothing new, nothing uploaded
    h = await reg.persist(lid, after=first.to_sqn)
    assert (h.from_sqn, h.to_sqn, h.entries) == (1, 1, ())
    assert up.calls == 1


@pytest.mark.asyncio
async def test_persist_sqn_out_of_range() -> None:
    reg = registry(MemoryUploader())
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    await reg.append(lid, batch((1, [b"x"])))
    with pytest.raises(SqnOutOfRange, match="only at 0"):
        await reg.persist(lid, after=1)  # from the future
    assert await reg.last_appended_sqn(lid) == 1
    await reg.append(lid, batch((1, [b"y"])))
    assert await reg.last_appended_sqn(lid) == 2
    await reg.truncate(lid, before=2)
    with pytest.raises(SqnOutOfRange, match="truncated"):
        await reg.persist(lid, after=1)
    with pytest.raises(SqnOutOfRange):
        await reg.truncate(lid, before=3)
    assert sample(reg.metrics, "dstl_persist_failures_total") == 2
    # the writer is unharmed
    await reg.append(lid, batch((1, [b"z"])))
    assert (await reg.persist(lid, after=2)).to_sqn == 3


# ---------------------------------------------------------------- reuse


@pytest.mark.asyncio
async def test_overlapping_persists_share_one_upload() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    reg = registry(up)
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    await reg.append(lid, batch((1, [b"x" * 100])))
    p1 = asyncio.create_task(reg.persist(lid, after=0))
    await up.until(lambda: up.calls == 1)
    p2 = asyncio.create_task(reg.persist(lid, after=0))
    await settle()
    up.gate.set()
    h1, h2 = await p1, await p2
    assert up.calls == 1
    assert h1 == h2


@pytest.mark.asyncio
async def test_sequential_persists_upload_only_what_is_new() -> None:
    up = MemoryUploader()
    reg = registry(up)
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    handles = []
    for i in range(4):
        await reg.append(lid, batch((i, [f"change {i}".encode()])))
        handles.append(await reg.persist(lid, after=0))
        assert up.calls == i + 1
    last = handles[-1]
    assert [e for h in handles for e in h.entries[-1:]] == list(last.entries)
    assert len(up.objects) == 4
    assert await read_handle(up, last) == [(i, i, [f"change {i}".encode()]) for i in range(4)]
    # every checkpoint's handle stays readable: the older sections are shared
    assert await read_handle(up, handles[1]) == [(0, 0, [b"change 0"]), (1, 1, [b"change 1"])]


# ---------------------------------------------------------------- batching


@pytest.mark.asyncio
async def test_many_writers_of_one_job_share_one_object() -> None:
    up = MemoryUploader()
    reg = registry(up, persist_delay_ms=LONG_DELAY_MS)
    writers = [reg.create_writer("job", f"op-{i}", (i * 10, i * 10 + 9)) for i in range(20)]
    for i, wl in enumerate(writers):
        await reg.append(wl.log_id, batch((i * 10 + 3, [f"writer {i}".encode()] * (i + 1))))
    handles = await asyncio.wait_for(
        asyncio.gather(*(reg.persist(wl.log_id, after=0) for wl in writers)), 5
    )
    assert up.calls == 1
    (key,) = up.objects
    assert parse_object(up.objects[key]).sections.keys() == {wl.log_id_bytes for wl in writers}
    for i, h in enumerate(handles):
        assert [e.object_key for e in h.entries] == [key]
        # each handle reads exactly its own writer's changes
        assert await read_handle(up, h) == [(i * 10 + 3, 0, [f"writer {i}".encode()] * (i + 1))]
    assert sample(reg.metrics, "dstl_flushes_total", trigger="all_waiting") == 1
    assert sample(reg.metrics, "dstl_upload_logs_per_object_sum") == 20


@pytest.mark.asyncio
async def test_separate_objects_per_job() -> None:
    up = MemoryUploader()
    reg = registry(up, persist_delay_ms=LONG_DELAY_MS)
    w1 = reg.create_writer("job-one", "op", (0, 3))
    w2 = reg.create_writer("job-two", "op", (0, 3))
    await reg.append(w1.log_id, batch((0, [b"1"])))
    await reg.append(w2.log_id, batch((0, [b"2"])))
    h1, h2 = await asyncio.wait_for(
        asyncio.gather(reg.persist(w1.log_id, 0), reg.persist(w2.log_id, 0)), 5
    )
    assert up.calls == 2
    assert sorted(up.jobs) == ["job-one", "job-two"]
    assert h1.entries[0].object_key.startswith("job-one/")
    assert h2.entries[0].object_key.startswith("job-two/")
    assert (h1.job_id, h2.job_id) == ("job-one", "job-two")


@pytest.mark.asyncio
async def test_flush_on_delay_when_not_every_writer_waits() -> None:
    up = MemoryUploader()
    reg = registry(up, persist_delay_ms=200.0)
    w1 = reg.create_writer("job", "op-1", (0, 3))
    reg.create_writer("job", "op-2", (0, 3))  # never persists
    await reg.append(w1.log_id, batch((0, [b"x"])))
    started = time.monotonic()
    task = asyncio.create_task(reg.persist(w1.log_id, after=0))
    await settle()
    assert up.calls == 0  # waiting for the other writer or the delay
    await asyncio.wait_for(task, 5)
    assert time.monotonic() - started >= 0.19
    assert up.calls == 1
    assert sample(reg.metrics, "dstl_flushes_total", trigger="delay") == 1


@pytest.mark.asyncio
async def test_flush_on_size_threshold() -> None:
    up = MemoryUploader()
    reg = registry(
        up,
        persist_delay_ms=LONG_DELAY_MS,
        batch_size_threshold=1000,
        preemptive_persist_threshold=0,
    )
    w1 = reg.create_writer("job", "op-1", (0, 3))
    w2 = reg.create_writer("job", "op-2", (0, 3))
    await reg.append(w2.log_id, batch((0, [b"s"] * 10)))
    small = asyncio.create_task(reg.persist(w2.log_id, after=0))
    await settle()
    assert up.calls == 0  # 50 bytes queued: below the threshold, one writer of two waits
    # another job whose second writer never persists: only the size can trigger
    w3 = reg.create_writer("job-big", "op", (0, 3))
    reg.create_writer("job-big", "idle", (0, 3))
    await reg.append(w3.log_id, batch((0, [b"z" * 1200])))
    big = await asyncio.wait_for(reg.persist(w3.log_id, after=0), 5)
    assert sample(reg.metrics, "dstl_flushes_total", trigger="size") == 1
    assert await read_handle(up, big) == [(0, 0, [b"z" * 1200])]
    assert up.calls == 1 and not small.done()
    await reg.append(w1.log_id, batch((1, [b"x"])))
    h1 = await asyncio.wait_for(reg.persist(w1.log_id, after=0), 5)  # now all of "job" wait
    assert (await small).entries[0].object_key == h1.entries[0].object_key
    assert sample(reg.metrics, "dstl_flushes_total", trigger="all_waiting") == 1
    assert up.calls == 2


@pytest.mark.asyncio
async def test_flush_immediately_without_delay() -> None:
    up = MemoryUploader()
    reg = registry(up, persist_delay_ms=0.0)
    w1 = reg.create_writer("job", "op-1", (0, 3))
    reg.create_writer("job", "op-2", (0, 3))
    await reg.append(w1.log_id, batch((0, [b"x"])))
    await asyncio.wait_for(reg.persist(w1.log_id, after=0), 5)
    assert sample(reg.metrics, "dstl_flushes_total", trigger="immediate") == 1


@pytest.mark.asyncio
async def test_closed_writers_do_not_hold_back_the_all_waiting_flush() -> None:
    up = MemoryUploader()
    reg = registry(up, persist_delay_ms=LONG_DELAY_MS)
    w1 = reg.create_writer("job", "op-1", (0, 3))
    w2 = reg.create_writer("job", "op-2", (0, 3))
    reg.close_writer(w2.log_id)
    await reg.append(w1.log_id, batch((0, [b"x"])))
    await asyncio.wait_for(reg.persist(w1.log_id, after=0), 5)
    assert sample(reg.metrics, "dstl_flushes_total", trigger="all_waiting") == 1


# ---------------------------------------------------------------- pre-emptive uploads


@pytest.mark.asyncio
async def test_preemptive_upload_at_the_threshold() -> None:
    up = MemoryUploader()
    # the threshold is exactly what the three parts are charged (data + per-part overhead)
    threshold = charged(b"a" * 500) + charged(b"b" * 400) + charged(b"c" * 100)
    reg = registry(up, preemptive_persist_threshold=threshold, persist_delay_ms=5.0)
    wl = reg.create_writer("job", "op", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"a" * 500])))
    await reg.append(wl.log_id, batch((1, [b"b" * 400])))
    await settle()
    assert up.calls == 0  # two parts: below the threshold
    assert wl.active_bytes == threshold - charged(b"c" * 100)
    # three parts: at the threshold; the changes still went into changeset 0
    assert await reg.append(wl.log_id, batch((2, [b"c" * 100]))) == 0
    assert wl.active_sqn == 1  # the changeset was closed for the upload
    await up.until(lambda: up.calls == 1)
    await up.until(lambda: reg.budget.used == 0)
    assert sample(reg.metrics, "dstl_preemptive_uploads_total") == 1
    # the checkpoint finds everything uploaded already: no new upload
    h = await reg.persist(wl.log_id, after=0)
    assert up.calls == 1
    assert (h.from_sqn, h.to_sqn) == (0, 1)
    assert await read_handle(up, h) == [
        (0, 0, [b"a" * 500]),
        (1, 0, [b"b" * 400]),
        (2, 0, [b"c" * 100]),
    ]
    await reg.append(wl.log_id, batch((3, [b"d"])))
    h = await reg.persist(wl.log_id, after=0)
    assert up.calls == 2 and len(h.entries) == 2


# ---------------------------------------------------------------- truncate / close


@pytest.mark.asyncio
async def test_truncate_frees_memory_and_keeps_objects() -> None:
    up = MemoryUploader()
    reg = registry(up)
    wl = reg.create_writer("job", "op", (0, 3))
    lid = wl.log_id
    await reg.append(lid, batch((0, [b"a" * 100])))
    h = await reg.persist(lid, after=0)
    await reg.append(lid, batch((0, [b"b" * 100])))
    await reg.last_appended_sqn(lid)
    await reg.append(lid, batch((0, [b"c" * 100])))
    part = charged(b"b" * 100)  # b and c are charged the same
    assert reg.budget.used == 2 * part
    await reg.truncate(lid, before=2)  # drops a (uploaded) and b (not uploaded)
    assert reg.budget.used == part
    assert sorted(wl.not_uploaded) == [] and sorted(wl.uploaded) == []
    assert wl.active_bytes == part
    assert await read_handle(up, h) == [(0, 0, [b"a" * 100])]  # the object is still there
    await reg.truncate(lid, before=1)  # an older truncation point changes nothing
    assert reg.budget.used == part
    assert sample(reg.metrics, "dstl_unuploaded_bytes") == part
    h2 = await reg.persist(lid, after=2)
    assert await read_handle(up, h2) == [(0, 2, [b"c" * 100])]
    assert reg.budget.used == 0


@pytest.mark.asyncio
async def test_truncate_during_an_upload() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    reg = registry(up)
    wl = reg.create_writer("job", "op", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"a" * 100])))
    task = asyncio.create_task(reg.persist(wl.log_id, after=0))
    await up.until(lambda: up.calls == 1)
    await reg.truncate(wl.log_id, before=1)
    assert reg.budget.used == charged(b"a" * 100)  # still held by the running upload
    up.gate.set()
    h = await task
    assert await read_handle(up, h) == [(0, 0, [b"a" * 100])]
    assert reg.budget.used == 0
    assert wl.uploaded == {}  # truncated: no reference kept


@pytest.mark.asyncio
async def test_close_drops_unpersisted_changes() -> None:
    up = MemoryUploader()
    reg = registry(up)
    wl = reg.create_writer("job", "op", (0, 3))
    other = reg.create_writer("job", "op2", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"gone"] * 10)))
    await reg.last_appended_sqn(wl.log_id)
    await reg.append(wl.log_id, batch((1, [b"also gone"])))
    await reg.append(other.log_id, batch((1, [b"kept"])))
    reg.close_writer(wl.log_id)
    assert reg.budget.used == charged(b"kept")
    assert up.calls == 0
    assert len(reg) == 1
    assert sample(reg.metrics, "dstl_writers") == 1
    with pytest.raises(LogNotFound):
        await reg.last_appended_sqn(wl.log_id)
    with pytest.raises(LogNotFound):
        await reg.truncate(wl.log_id, 0)
    with pytest.raises(LogNotFound):
        reg.close_writer(wl.log_id)
    with pytest.raises(LogNotFound):
        await reg.append(wl.log_id, batch((0, [b"x"])))
    with pytest.raises(LogNotFound):
        await reg.persist(wl.log_id, after=0)
    h = await reg.persist(other.log_id, after=0)
    assert await read_handle(up, h) == [(1, 0, [b"kept"])]


@pytest.mark.asyncio
async def test_close_during_an_upload_releases_memory() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    reg = registry(up)
    wl = reg.create_writer("job", "op", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"a" * 100])))
    task = asyncio.create_task(reg.persist(wl.log_id, after=0))
    await up.until(lambda: up.calls == 1)
    reg.close_writer(wl.log_id)
    assert reg.budget.used == charged(b"a" * 100)
    up.gate.set()
    await task  # the upload itself completes
    await settle()
    assert reg.budget.used == 0
    with pytest.raises(WriterClosed):
        wl.check_open()


# ---------------------------------------------------------------- failures


@pytest.mark.asyncio
async def test_failed_upload_keeps_the_changes() -> None:
    up = MemoryUploader()
    up.fail_next = 1
    reg = registry(up)
    wl = reg.create_writer("job", "op", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"precious"])))
    with pytest.raises(UploadFailed, match="injected"):
        await reg.persist(wl.log_id, after=0)
    assert reg.budget.used == charged(b"precious")
    assert sorted(wl.not_uploaded) == [0] and not wl.uploading
    assert sample(reg.metrics, "dstl_persist_failures_total") == 1
    await reg.append(wl.log_id, batch((1, [b"more"])))
    h = await reg.persist(wl.log_id, after=0)
    assert up.calls == 2
    assert len(h.entries) == 1  # one section holds both changesets
    assert await read_handle(up, h) == [(0, 0, [b"precious"]), (1, 1, [b"more"])]
    assert reg.budget.used == 0


@pytest.mark.asyncio
async def test_failed_upload_fails_every_waiting_persist() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    up.fail_next = 1
    reg = registry(up)
    wl = reg.create_writer("job", "op", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"x"])))
    p1 = asyncio.create_task(reg.persist(wl.log_id, after=0))
    await up.until(lambda: up.calls == 1)
    p2 = asyncio.create_task(reg.persist(wl.log_id, after=0))
    await settle()
    up.gate.set()
    for p in (p1, p2):
        with pytest.raises(UploadFailed):
            await p
    h = await reg.persist(wl.log_id, after=0)
    assert await read_handle(up, h) == [(0, 0, [b"x"])]


# ---------------------------------------------------------------- backpressure


@pytest.mark.asyncio
async def test_an_append_over_the_budget_is_refused_at_once() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    reg = registry(
        up,
        max_in_flight_bytes=4096,
        batch_size_threshold=4096,
        preemptive_persist_threshold=0,
        backpressure_timeout_s=0.2,
    )
    wl = reg.create_writer("job", "op", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"a" * 3000])))
    await reg.append(wl.log_id, batch((1, [b"b" * 3000])))  # within the limit: overcommits
    assert reg.budget.used == 2 * charged(b"a" * 3000)
    started = time.monotonic()
    with pytest.raises(BudgetFull):  # refused at once: nothing waits holding its request
        await reg.append(wl.log_id, batch((2, [b"rejected"])))
    assert time.monotonic() - started < 0.19
    assert sample(reg.metrics, "dstl_backpressure_waits_total") == 1
    await settle()
    assert up.calls == 1  # the pressure started an upload of what was waiting
    up.gate.set()
    await up.until(lambda: reg.budget.used == 0)
    h = await reg.persist(wl.log_id, after=0)
    # the rejected batch was not appended; nothing else was lost
    assert await read_handle(up, h) == [(0, 0, [b"a" * 3000]), (1, 0, [b"b" * 3000])]


@pytest.mark.asyncio
async def test_refused_appends_proceed_once_uploads_finish() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    reg = registry(
        up,
        max_in_flight_bytes=4096,
        batch_size_threshold=4096,
        preemptive_persist_threshold=0,
        backpressure_timeout_s=30.0,
    )
    wl = reg.create_writer("job", "op", (0, 3))
    other = reg.create_writer("job", "op2", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"a" * 5000])))
    with pytest.raises(BudgetFull):  # the gated upload holds the budget
        await reg.append(wl.log_id, batch((1, [b"waited"])))
    with pytest.raises(BudgetFull):
        await reg.append(other.log_id, batch((1, [b"too"])))
    up.gate.set()
    await up.until(lambda: reg.budget.used == 0)
    assert await reg.append(wl.log_id, batch((1, [b"waited"]))) == 1  # sent again
    await reg.append(other.log_id, batch((1, [b"too"])))
    h = await reg.persist(wl.log_id, after=0)
    assert await read_handle(up, h) == [(0, 0, [b"a" * 5000]), (1, 1, [b"waited"])]
    h = await reg.persist(other.log_id, after=0)
    assert await read_handle(up, h) == [(1, 0, [b"too"])]
    assert reg.budget.used == 0


# ---------------------------------------------------------------- bad input


@pytest.mark.asyncio
async def test_bad_appends_leave_every_log_untouched() -> None:
    up = MemoryUploader()
    reg = registry(up, max_change_bytes=100)
    good = reg.create_writer("job", "good", (0, 9))
    bad = reg.create_writer("job", "bad", (10, 19))
    await reg.append(good.log_id, batch((5, [b"good data"])))
    await reg.append(bad.log_id, batch((10, [b"before"])))
    used = reg.budget.used
    cases: list[tuple[type[Exception], list[pb.KeyGroupChanges]]] = [
        (KeyGroupOutOfRange, batch((11, [b"ok"]), (5, [b"wrong kg"]))),
        (KeyGroupOutOfRange, batch((20, [b"past the end"]))),
        (ChangeTooLarge, batch((11, [b"ok"]), (12, [b"x" * 101]))),
        (InvalidArgument, [part(11, PackedChanges(2, pack_changes([b"a"]).sizes, b"a"))]),
        (InvalidArgument, [part(11, PackedChanges(1, pack_changes([b"abc"]).sizes, b"ab"))]),
        (InvalidArgument, [part(11, PackedChanges(0, b"", b"payload"))]),
        (InvalidArgument, []),  # an empty batch
        (InvalidArgument, [part(11, PackedChanges(0, b"", b""))]),  # a part without changes
        (InvalidArgument, batch((11, [b"ok"]), (12, []))),  # ...after a good part
    ]
    for exc_type, batches in cases:
        with pytest.raises(exc_type) as info:
            await reg.append(bad.log_id, batches)
        if exc_type is InvalidArgument:
            assert not isinstance(info.value, ChangeTooLarge)
    with pytest.raises(LogNotFound):
        await reg.append("0" * 32, batch((5, [b"nobody"])))
    assert reg.budget.used == used  # all or nothing: no partial batch was kept
    assert list(bad.active) == [10]
    hg = await reg.persist(good.log_id, after=0)
    hb = await reg.persist(bad.log_id, after=0)
    assert await read_handle(up, hg) == [(5, 0, [b"good data"])]
    assert await read_handle(up, hb) == [(10, 0, [b"before"])]
    assert (await reg.append(bad.log_id, batch((19, [b"x" * 100])))) == 1


@pytest.mark.parametrize(
    ("job", "op", "kg_range"),
    [
        ("", "op", (0, 1)),
        ("bad/job", "op", (0, 1)),
        ("job", "", (0, 1)),
        ("job", "o" * 257, (0, 1)),
        ("job", "op", (5, 4)),
        ("job", "op", (-1, 4)),
        ("job", "op", (0, 1 << 24)),
    ],
)
@pytest.mark.asyncio
async def test_create_writer_rejects_bad_input(
    job: str, op: str, kg_range: tuple[int, int]
) -> None:
    reg = registry(MemoryUploader())
    with pytest.raises(InvalidArgument):
        reg.create_writer(job, op, kg_range)
    assert len(reg) == 0


@pytest.mark.asyncio
async def test_max_writers() -> None:
    reg = registry(MemoryUploader(), max_writers=2)
    w = reg.create_writer("job", "a", (0, 0))
    reg.create_writer("job", "b", (0, 0))
    with pytest.raises(TooManyWriters, match="max_writers=2") as info:
        reg.create_writer("job", "c", (0, 0))
    assert info.value.grpc_code == "RESOURCE_EXHAUSTED"
    assert not isinstance(info.value, InvalidArgument)
    with pytest.raises(TooManyWriters, match="max_writers=2"):  # the node's limit: every job
        reg.create_writer("other-job", "c", (0, 0))
    assert sample(reg.metrics, "dstl_writer_quota_refusals_total", scope="node") == 2
    assert len(reg) == 2
    reg.close_writer(w.log_id)
    reg.create_writer("job", "c", (0, 0))


@pytest.mark.asyncio
async def test_max_writers_per_job() -> None:
    reg = registry(MemoryUploader(), max_writers=10, max_writers_per_job=2)
    a1 = reg.create_writer("job-a", "op-1", (0, 0))
    reg.create_writer("job-a", "op-2", (0, 0))
    with pytest.raises(TooManyWriters, match="max_writers_per_job=2") as info:
        reg.create_writer("job-a", "op-3", (0, 0))
    assert info.value.grpc_code == "RESOURCE_EXHAUSTED"
    assert "job-a" in info.value.message
    assert sample(reg.metrics, "dstl_writer_quota_refusals_total", scope="job") == 1
    # another job still gets its own writers while job-a is full
    b1 = reg.create_writer("job-b", "op-1", (0, 0))
    reg.create_writer("job-b", "op-2", (0, 0))
    with pytest.raises(TooManyWriters, match="job-b"):
        reg.create_writer("job-b", "op-3", (0, 0))
    assert len(reg) == 4
    await reg.append(b1.log_id, batch((0, [b"b works"])))
    # closing a writer of job-a frees a slot of job-a only
    reg.close_writer(a1.log_id)
    reg.create_writer("job-a", "op-3", (0, 0))
    with pytest.raises(TooManyWriters):
        reg.create_writer("job-b", "op-3", (0, 0))
    assert sample(reg.metrics, "dstl_writer_quota_refusals_total", scope="job") == 3
    assert sample(reg.metrics, "dstl_writer_quota_refusals_total", scope="node") == 0


# ---------------------------------------------------------------- idle writers


@pytest.mark.asyncio
async def test_idle_writers_expire() -> None:
    up = MemoryUploader()
    reg = registry(up, writer_idle_timeout_s=100.0, max_writers_per_job=2)
    idle = reg.create_writer("job", "idle", (0, 3))
    busy = reg.create_writer("job", "busy", (0, 3))
    await reg.append(idle.log_id, batch((0, [b"unpersisted"])))
    await reg.append(busy.log_id, batch((0, [b"kept"])))
    h = await reg.persist(idle.log_id, after=0)  # persisted: stays readable after expiry
    await reg.append(idle.log_id, batch((1, [b"dropped"])))
    now = time.monotonic()
    assert reg.expire_idle(now) == 0  # both had a call just now
    idle.last_call = now - 100.0  # exactly the timeout
    busy.last_call = now - 99.0
    assert reg.expire_idle(now) == 1
    assert len(reg) == 1 and sample(reg.metrics, "dstl_writers") == 1
    assert sample(reg.metrics, "dstl_writers_expired_total") == 1
    assert reg.budget.used == charged(b"kept")  # the expired writer's bytes are freed
    with pytest.raises(WriterClosed):
        idle.check_open()
    # a later call of the expired writer says what may have happened
    with pytest.raises(LogNotFound, match="expired after 100s without a call"):
        await reg.append(idle.log_id, batch((0, [b"late"])))
    with pytest.raises(LogNotFound, match="expired"):
        await reg.persist(idle.log_id, after=0)
    assert await read_handle(up, h) == [(0, 0, [b"unpersisted"])]
    # its job's slot is free again (max_writers_per_job=2)
    reg.create_writer("job", "replacement", (0, 3))
    # a call refreshes the writer: the sweep at the same time no longer finds it idle
    busy.last_call = now - 1000.0
    await reg.last_appended_sqn(busy.log_id)
    assert busy.last_call >= now
    assert reg.expire_idle(now + 99.0) == 0
    assert reg.expire_idle() == 0  # the default clock: nothing idle for 100 s
    assert len(reg) == 2


@pytest.mark.asyncio
async def test_a_writer_with_an_upload_in_flight_does_not_expire() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    reg = registry(up, writer_idle_timeout_s=100.0)
    wl = reg.create_writer("job", "op", (0, 3))
    await reg.append(wl.log_id, batch((0, [b"uploading"])))
    persist = asyncio.create_task(reg.persist(wl.log_id, after=0))
    await up.until(lambda: up.calls == 1)
    later = time.monotonic() + 1000.0
    assert reg.expire_idle(later) == 0  # idle for long, but its upload is still running
    assert len(reg) == 1
    up.gate.set()
    h = await asyncio.wait_for(persist, 5)
    await settle()
    assert not wl.uploading
    assert reg.expire_idle(later) == 1  # once the upload ended it is idle
    assert reg.budget.used == 0
    assert await read_handle(up, h) == [(0, 0, [b"uploading"])]


# ---------------------------------------------------------------- memory accounting


@pytest.mark.asyncio
async def test_tiny_parts_are_charged_their_overhead() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    limit = 10 * PART_OVERHEAD_BYTES
    reg = registry(
        up,
        max_in_flight_bytes=limit,
        batch_size_threshold=limit,
        preemptive_persist_threshold=0,
        backpressure_timeout_s=0.05,
    )
    wl = reg.create_writer("job", "op", (0, 19))
    # twenty one-byte changes in twenty parts: 100 bytes of data, but over the limit
    tiny = [(kg, [b"x"]) for kg in range(20)]
    await reg.append(wl.log_id, batch(*tiny))
    assert reg.budget.used == 20 * charged(b"x") > limit
    assert sample(reg.metrics, "dstl_appended_bytes_total") == 20 * pack_changes([b"x"]).nbytes
    with pytest.raises(Backpressure):
        await reg.append(wl.log_id, batch((0, [b"y"])))
    up.gate.set()
    await up.until(lambda: reg.budget.used == 0)


@pytest.mark.asyncio
async def test_drain_refuses_new_writers_and_finishes_uploads() -> None:
    up = MemoryUploader()
    up.gate = asyncio.Event()
    reg = registry(up)
    wl = reg.create_writer("job", "op", (0, 0))
    await reg.append(wl.log_id, batch((0, [b"x"])))
    persist = asyncio.create_task(reg.persist(wl.log_id, after=0))
    await up.until(lambda: up.calls == 1)
    drain = asyncio.create_task(reg.drain(5.0))
    await settle()
    with pytest.raises(ShuttingDown):
        reg.create_writer("job", "late", (0, 0))
    assert not drain.done()
    up.gate.set()
    assert await drain is True
    assert await read_handle(up, await persist) == [(0, 0, [b"x"])]
    # after the drain, new persists are refused instead of hanging
    await reg.append(wl.log_id, batch((0, [b"y"])))
    with pytest.raises(ShuttingDown):
        await reg.persist(wl.log_id, after=0)
