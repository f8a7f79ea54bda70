"""WriterLog: one writer's SQNs and changesets through their states."""

from __future__ import annotations

import asyncio

import pytest

from dstl_client.core.errors import KeyGroupOutOfRange, SqnOutOfRange, WriterClosed
from dstl_client.core.format import pack_changes
from dstl_client.core.handle import HandleEntry
from dstl_server.log import (
    INITIAL_SQN,
    PART_OVERHEAD_BYTES,
    UploadTask,
    WriterLog,
    held_bytes,
)


def new_log() -> WriterLog:
    return WriterLog("job", "op", (4, 7))


def add(wl: WriterLog, kg: int, *changes: bytes) -> int:
    """Append one part; return the bytes the budget charges for it (data + overhead)."""
    packed = pack_changes(list(changes))
    wl.append(kg, packed)
    return packed.nbytes + PART_OVERHEAD_BYTES


def task_for(wl: WriterLog, after: int | None = None) -> UploadTask:
    css = wl.take_not_uploaded(after)
    fut: asyncio.Future[HandleEntry] = asyncio.get_running_loop().create_future()
    task = UploadTask(wl, css, css[-1].sqn + 1, sum(c.nbytes for c in css), False, fut)
    wl.start_upload(task)
    return task


def entry(task: UploadTask, key: str = "job/00/k") -> HandleEntry:
    return HandleEntry(key, 16, 100, task.changesets[0].sqn, task.end_sqn)


def test_ids_and_initial_state() -> None:
    a, b = new_log(), new_log()
    assert a.log_id != b.log_id
    assert len(a.log_id_bytes) == 16 and a.log_id == a.log_id_bytes.hex()
    assert a.active_sqn == INITIAL_SQN == 0
    assert a.pending_bytes == 0 and a.unuploaded_bytes() == 0


def test_check_key_group_is_inclusive() -> None:
    wl = new_log()
    wl.check_key_group(4)
    wl.check_key_group(7)
    for kg in (3, 8):
        with pytest.raises(KeyGroupOutOfRange):
            wl.check_key_group(kg)


def test_rollover_closes_only_non_empty_changesets() -> None:
    wl = new_log()
    assert wl.rollover() == 0
    n1 = add(wl, 4, b"a", b"bb")
    n2 = add(wl, 4, b"c")
    n3 = add(wl, 5, b"d")
    assert wl.active_bytes == wl.pending_bytes == n1 + n2 + n3
    assert wl.rollover() == 1
    assert wl.rollover() == 1
    assert wl.active == {} and wl.active_bytes == 0
    cs = wl.not_uploaded[0]
    assert cs.sqn == 0 and sorted(cs.groups) == [4, 5] and len(cs.groups[4]) == 2
    assert wl.pending_bytes == wl.unuploaded_bytes() == n1 + n2 + n3 == held_bytes(cs)


def test_every_part_is_charged_its_bytes_plus_the_overhead() -> None:
    wl = new_log()
    for _ in range(10):
        add(wl, 4, b"x")  # ten one-byte changes: 50 data bytes in ten parts
    wl.rollover()
    cs = wl.not_uploaded[0]
    assert cs.nbytes == 10 * (4 + 1)
    assert held_bytes(cs) == cs.nbytes + 10 * PART_OVERHEAD_BYTES
    assert wl.pending_bytes == wl.unuploaded_bytes() == held_bytes(cs)


def test_take_not_uploaded_from_an_sqn() -> None:
    wl = new_log()
    for i in range(4):
        add(wl, 4, bytes([i]))
        wl.rollover()
    assert [cs.sqn for cs in wl.take_not_uploaded(2)] == [2, 3]
    assert sorted(wl.not_uploaded) == [0, 1]
    assert [cs.sqn for cs in wl.take_not_uploaded(None)] == [0, 1]
    assert wl.take_not_uploaded(None) == []


def test_check_persist_from() -> None:
    wl = new_log()
    add(wl, 4, b"x")
    wl.check_persist_from(0)
    with pytest.raises(SqnOutOfRange):
        wl.check_persist_from(1)
    wl.rollover()
    add(wl, 4, b"y")
    wl.rollover()
    wl.check_persist_from(2)
    wl.truncate(1)
    wl.check_persist_from(1)
    with pytest.raises(SqnOutOfRange, match="truncated"):
        wl.check_persist_from(0)


async def test_upload_success_frees_data_and_keeps_the_entry() -> None:
    wl = new_log()
    nbytes = add(wl, 4, b"abc")
    wl.rollover()
    nbytes += add(wl, 5, b"de")
    wl.rollover()
    task = task_for(wl)
    assert sorted(wl.uploading) == [0, 1] and not wl.not_uploaded
    assert wl.sections_from(0) == [task]  # one task covering two SQNs, listed once
    e = entry(task)
    assert wl.finish_upload(task, e) == nbytes
    assert wl.pending_bytes == 0
    assert wl.uploaded == {0: e, 1: e} and not wl.uploading
    assert wl.sections_from(0) == [e]
    assert wl.sections_from(1) == [e]
    assert wl.sections_from(2) == []


async def test_upload_failure_returns_changesets() -> None:
    wl = new_log()
    nbytes = add(wl, 4, b"abc")
    wl.rollover()
    task = task_for(wl)
    assert wl.finish_upload(task, None) == 0
    assert sorted(wl.not_uploaded) == [0] and not wl.uploading
    assert wl.pending_bytes == nbytes


async def test_upload_failure_after_truncate_or_close_frees() -> None:
    wl = new_log()
    nbytes = add(wl, 4, b"abc")
    wl.rollover()
    add(wl, 4, b"later")
    wl.rollover()
    task = task_for(wl, after=0)
    wl.truncate(1)  # SQN 0 is no longer needed, SQN 1 is
    freed = wl.finish_upload(task, None)
    assert freed == nbytes
    assert sorted(wl.not_uploaded) == [1]

    wl2 = new_log()
    n2 = add(wl2, 4, b"x")
    wl2.rollover()
    task2 = task_for(wl2)
    assert wl2.close() == 0  # the uploading bytes are not freed by close...
    assert wl2.finish_upload(task2, None) == n2  # ...but when the upload ends
    assert wl2.pending_bytes == 0 and not wl2.not_uploaded


async def test_sections_mix_uploaded_and_uploading_in_sqn_order() -> None:
    wl = new_log()
    add(wl, 4, b"a")
    wl.rollover()
    t1 = task_for(wl)
    e1 = entry(t1, "job/00/one")
    wl.finish_upload(t1, e1)
    add(wl, 4, b"b")
    wl.rollover()
    add(wl, 4, b"c")
    wl.rollover()
    t2 = task_for(wl)
    assert wl.sections_from(0) == [e1, t2]
    assert wl.sections_from(1) == [t2]
    assert wl.sections_from(2) == [t2]  # t2 holds SQN 1 and 2: the reader filters SQN 1


async def test_truncate() -> None:
    wl = new_log()
    n0 = add(wl, 4, b"zero")
    wl.rollover()
    t = task_for(wl)
    wl.finish_upload(t, entry(t))
    n1 = add(wl, 4, b"one")
    wl.rollover()
    n2 = add(wl, 4, b"two")
    assert wl.pending_bytes == n1 + n2 and n0
    with pytest.raises(SqnOutOfRange):
        wl.truncate(3)
    assert wl.truncate(2) == n1  # active changeset 2 stays
    assert not wl.uploaded and not wl.not_uploaded
    assert wl.pending_bytes == n2 and wl.truncated_before == 2
    assert wl.truncate(2) == 0
    assert wl.truncate(1) == 0  # going back is a no-op
    assert wl.truncated_before == 2


async def test_close_drops_everything_unpersisted() -> None:
    wl = new_log()
    n0 = add(wl, 4, b"zero")
    wl.rollover()
    n1 = add(wl, 5, b"active")
    assert wl.close() == n0 + n1
    assert wl.pending_bytes == 0
    assert not wl.active and not wl.not_uploaded and not wl.uploaded
    with pytest.raises(WriterClosed):
        wl.check_open()


async def test_successful_upload_after_close_keeps_no_reference() -> None:
    wl = new_log()
    add(wl, 4, b"x")
    wl.rollover()
    t = task_for(wl)
    wl.close()
    wl.finish_upload(t, entry(t))
    assert wl.uploaded == {} and wl.pending_bytes == 0
