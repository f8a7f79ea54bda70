"""WriterLog: one writer's SQNs and changesets through their states.

Memory is counted by the :class:`MemoryBudget` alone: these tests charge it
as the registry does (before ``append``) and release what the log frees.
The upload states (uploading, uploaded) are driven by ``dstl_server.uploads``
and tested in test_uploads.py.
"""

from __future__ import annotations

import pytest

from dstl_client.core.errors import KeyGroupOutOfRange, SqnOutOfRange, WriterClosed
from dstl_client.core.format import pack_changes
from dstl_server.log import INITIAL_SQN, PART_OVERHEAD_BYTES, WriterLog, held_bytes
from dstl_server.throttle import MemoryBudget


def new_log() -> WriterLog:
    return WriterLog("job", "op", (4, 7))


def new_budget() -> MemoryBudget:
    return MemoryBudget(1 << 40, 1.0, lambda: None)


async def add(budget: MemoryBudget, wl: WriterLog, kg: int, *changes: bytes) -> int:
    """Append one part as the registry does: charge the budget, then append.

    Returns the bytes charged for it (data + overhead).
    """
    packed = pack_changes(list(changes))
    n = packed.nbytes + PART_OVERHEAD_BYTES
    await budget.acquire(n)
    wl.append(kg, packed)
    return n


@pytest.mark.asyncio
async def test_ids_and_initial_state() -> None:
    a, b = new_log(), new_log()
    assert a.log_id != b.log_id
    assert len(a.log_id_bytes) == 16 and a.log_id == a.log_id_bytes.hex()
    assert a.active_sqn == INITIAL_SQN == 0
    assert a.active_bytes == 0 and not a.active and not a.not_uploaded
    assert a.close() == 0  # it holds nothing the budget would have to release


def test_check_key_group_is_inclusive() -> None:
    wl = new_log()
    wl.check_key_group(4)
    wl.check_key_group(7)
    for kg in (3, 8):
        with pytest.raises(KeyGroupOutOfRange):
            wl.check_key_group(kg)


@pytest.mark.asyncio
async def test_rollover_closes_only_non_empty_changesets() -> None:
    wl, budget = new_log(), new_budget()
    assert wl.rollover() == 0
    n1 = await add(budget, wl, 4, b"a", b"bb")
    n2 = await add(budget, wl, 4, b"c")
    n3 = await add(budget, wl, 5, b"d")
    assert wl.active_bytes == budget.used == n1 + n2 + n3
    assert wl.rollover() == 1
    assert wl.rollover() == 1
    assert wl.active == {} and wl.active_bytes == 0
    cs = wl.not_uploaded[0]
    assert cs.sqn == 0 and sorted(cs.groups) == [4, 5] and len(cs.groups[4]) == 2
    assert budget.used == n1 + n2 + n3 == held_bytes(cs)
    assert wl.close() == budget.used  # what the log frees is exactly what was charged


@pytest.mark.asyncio
async def test_every_part_is_charged_its_bytes_plus_the_overhead() -> None:
    wl, budget = new_log(), new_budget()
    for _ in range(10):
        await add(budget, wl, 4, b"x")  # ten one-byte changes: 50 data bytes in ten parts
    wl.rollover()
    cs = wl.not_uploaded[0]
    assert cs.nbytes == 10 * (4 + 1)
    assert held_bytes(cs) == cs.nbytes + 10 * PART_OVERHEAD_BYTES
    assert budget.used == held_bytes(cs)


@pytest.mark.asyncio
async def test_take_not_uploaded_from_an_sqn() -> None:
    wl, budget = new_log(), new_budget()
    for i in range(4):
        await add(budget, wl, 4, bytes([i]))
        wl.rollover()
    assert [cs.sqn for cs in wl.take_not_uploaded(2)] == [2, 3]
    assert sorted(wl.not_uploaded) == [0, 1]
    assert [cs.sqn for cs in wl.take_not_uploaded(None)] == [0, 1]
    assert wl.take_not_uploaded(None) == []


@pytest.mark.asyncio
async def test_check_persist_from() -> None:
    wl, budget = new_log(), new_budget()
    await add(budget, wl, 4, b"x")
    wl.check_persist_from(0)
    with pytest.raises(SqnOutOfRange):
        wl.check_persist_from(1)
    wl.rollover()
    await add(budget, wl, 4, b"y")
    wl.rollover()
    wl.check_persist_from(2)
    wl.truncate(1)
    wl.check_persist_from(1)
    with pytest.raises(SqnOutOfRange, match="truncated"):
        wl.check_persist_from(0)


@pytest.mark.asyncio
async def test_close_drops_everything_unpersisted() -> None:
    wl, budget = new_log(), new_budget()
    n0 = await add(budget, wl, 4, b"zero")
    wl.rollover()
    n1 = await add(budget, wl, 5, b"active")
    freed = wl.close()
    assert freed == n0 + n1
    budget.release(freed)
    assert budget.used == 0
    assert not wl.active and not wl.not_uploaded and not wl.uploaded
    with pytest.raises(WriterClosed):
        wl.check_open()
