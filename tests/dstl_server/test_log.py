"""WriterLog: one writer's SQNs and changesets through their states.

Memory is counted by the :class:`MemoryBudget` alone: these tests charge it
as the registry does (before ``append``) and release what the log frees.
The upload states (uploading, uploaded) are driven by ``dstl_server.uploads``
and tested in test_uploads.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client.core.errors import DstlError, KeyGroupOutOfRange, SqnOutOfRange, WriterClosed
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


@dataclass(frozen=True)
class _Part:
    """A key-group part as a call carries it."""

    key_group: int
    count: int
    sizes: bytes
    payload: bytes


def _part_error(wl: WriterLog, part: _Part, limit: int) -> DstlError | None:
    """The error of one part checked alone (None: it is fine)."""
    try:
        wl.check_parts([part], limit)
    except DstlError as exc:
        return exc
    return None


_SIZES = st.lists(st.integers(0, 40), max_size=4)


@st.composite
def _parts(draw: st.DrawFn) -> _Part:
    sizes = draw(_SIZES)
    count = (
        len(sizes) + draw(st.sampled_from([0, 0, 0, -1, 1])) if sizes else draw(st.integers(0, 1))
    )
    payload_len = sum(sizes) + draw(st.sampled_from([0, 0, 0, 1, -1]))
    return _Part(
        draw(st.sampled_from([4, 5, 7, 3, 8])),
        max(count, 0),
        struct.pack(f"<{len(sizes)}I", *sizes) + draw(st.sampled_from([b"", b"", b"\0"])),
        bytes(max(payload_len, 0)),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(_parts(), min_size=1, max_size=6))
def test_a_call_is_refused_for_its_first_bad_part(parts: list[_Part]) -> None:
    """The whole call is checked at once; a refused call gets the first bad part's error,
    the same as that part alone gets, and a call of good parts is taken whole."""
    wl = new_log()
    limit = 30
    errors = [e for e in (_part_error(wl, p, limit) for p in parts) if e is not None]
    if not errors:
        checked = wl.check_parts(parts, limit)
        assert isinstance(checked.parts, list)  # the repeated form is split
        assert [(kg, (p.count, p.sizes, p.payload)) for kg, p in checked.parts] == [
            (p.key_group, (p.count, p.sizes, p.payload)) for p in parts
        ]
        assert checked.nbytes == sum(len(p.sizes) + len(p.payload) for p in parts)
        assert checked.count == sum(p.count for p in parts)
        return
    with pytest.raises(DstlError) as info:
        wl.check_parts(parts, limit)
    assert type(info.value) is type(errors[0])
    assert str(info.value) == str(errors[0])
