"""A writer's calls are applied in the order the client made them.

First the :class:`CallSequencer` alone, then the registry's ordered calls
(``append``, ``persist``, ``truncate``, ``last_appended_sqn``) driven out of
order: their effects must be those of the client's order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from dstl_client.core.errors import (
    BudgetFull,
    CallLost,
    InvalidArgument,
    KeyGroupOutOfRange,
    SqnOutOfRange,
    WriterFailed,
)
from dstl_client.core.format import MAX_PARTS_PER_REQUEST
from dstl_server.call_order import CallSequencer
from dstl_server.log import PART_OVERHEAD_BYTES
from tests.fakes import MemoryUploader, batch, read_handle, registry, sample

S1 = 11
S2 = 22

T = TypeVar("T")


async def started(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro`` as a task until it first waits (e.g. for its turn); return the task.

    The task sets an event and goes straight on into ``coro``; this caller
    wakes only after the task has stopped at its first wait (or finished).
    """
    ready = asyncio.Event()

    async def run() -> T:
        ready.set()
        return await coro

    task = asyncio.create_task(run())
    await ready.wait()
    return task


async def _call(
    seq_: CallSequencer, session: int, seq: int, log: list[int], hold: float = 0
) -> None:
    await seq_.enter(session, seq, timeout_s=1.0)
    try:
        log.append(seq)
        if hold:  # a slow call: a duration on the sequencer's real clock, not a wait for it
            await asyncio.sleep(hold)
    finally:
        seq_.leave(session, seq)


@pytest.mark.asyncio
async def test_calls_arriving_out_of_order_are_applied_in_order() -> None:
    sq = CallSequencer()
    applied: list[int] = []
    late = [await started(_call(sq, S1, n, applied)) for n in (4, 2, 3)]
    assert applied == []  # 2..4 wait for 1
    await _call(sq, S1, 1, applied)
    await asyncio.gather(*late)
    assert applied == [1, 2, 3, 4]


@pytest.mark.asyncio
async def test_unordered_calls_do_not_wait() -> None:
    sq = CallSequencer()
    applied: list[int] = []
    await _call(sq, S1, 0, applied)
    assert applied == [0]


@pytest.mark.asyncio
async def test_a_call_that_never_arrives_fails_the_session() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    with pytest.raises(CallLost, match="call 2 of this writer never reached"):
        await asyncio.wait_for(sq.enter(S1, 3, timeout_s=0.1), 5)
    # every later call of that session fails fast too
    with pytest.raises(CallLost):
        await sq.enter(S1, 4, timeout_s=0.1)


@pytest.mark.asyncio
async def test_waiting_behind_an_arrived_slow_call_is_not_a_loss() -> None:
    sq = CallSequencer()
    applied: list[int] = []
    slow = await started(_call(sq, S1, 1, applied, hold=0.5))
    # call 2 waits longer than its 0.1 s timeout, but call 1 has arrived
    await asyncio.wait_for(sq.enter(S1, 2, timeout_s=0.1), 5)
    sq.leave(S1, 2)
    await slow
    assert sq.next_seq == 3


@pytest.mark.asyncio
async def test_duplicate_call_is_refused() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    with pytest.raises(InvalidArgument, match="already received"):
        await sq.enter(S1, 1, timeout_s=0.1)


@pytest.mark.asyncio
async def test_a_new_session_supersedes_the_old_one() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    stuck = await started(sq.enter(S1, 3, timeout_s=5))  # waits for 2
    applied: list[int] = []
    await _call(sq, S2, 1, applied)  # a reopened writer starts at 1
    assert applied == [1]
    with pytest.raises(CallLost, match="superseded"):
        await stuck
    with pytest.raises(CallLost, match="superseded"):
        await sq.enter(S1, 2, timeout_s=0.1)


# ---------------------------------------------------------------- bounds


@pytest.mark.parametrize("far", [2**62, 2**64 - 1])
@pytest.mark.asyncio
async def test_a_call_far_ahead_fails_the_session_at_once(far: int) -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    waiting = await started(sq.enter(S1, 3, timeout_s=30))  # waits for 2
    t0 = time.monotonic()
    with pytest.raises(CallLost, match=f"call {far} arrived while call 2 is the next"):
        await asyncio.wait_for(sq.enter(S1, far, timeout_s=30), 5)
    assert time.monotonic() - t0 < 1.0  # no waiting, no walk over the gap
    # the call already waiting wakes with the error instead of its 30 s timeout
    with pytest.raises(CallLost, match="out of step"):
        await asyncio.wait_for(waiting, 5)
    # every later call of the session gets it too, the missing one included
    for seq in (2, 3, 4, far):
        with pytest.raises(CallLost, match="out of step"):
            await asyncio.wait_for(sq.enter(S1, seq, timeout_s=30), 5)
    assert not sq._arrived and not sq._turns  # nothing held for the refused calls
    # a reopened writer (a new session) starts afresh
    applied: list[int] = []
    await _call(sq, S2, 1, applied)
    assert applied == [1]


@pytest.mark.asyncio
async def test_max_ahead_boundary_follows_the_next_expected_call() -> None:
    sq = CallSequencer()
    for n in range(1, 6):
        await _call(sq, S1, n, [])
    assert sq.next_seq == 6
    last_allowed = 6 + CallSequencer.MAX_AHEAD - 1
    waiting = await started(sq.enter(S1, last_allowed, timeout_s=30))
    assert not waiting.done()  # within the window: it waits for its turn
    with pytest.raises(CallLost, match=f"at most {CallSequencer.MAX_AHEAD} calls"):
        await sq.enter(S1, last_allowed + 1, timeout_s=30)
    with pytest.raises(CallLost):
        await asyncio.wait_for(waiting, 5)


@pytest.mark.asyncio
async def test_a_lost_call_fails_every_waiter_of_a_full_window() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    # call 2 never arrives; every other call the window allows waits for it
    waiters = [
        asyncio.create_task(sq.enter(S1, n, timeout_s=0.1))
        for n in range(3, 2 + CallSequencer.MAX_AHEAD)
    ]
    results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
    assert all(isinstance(r, CallLost) for r in results)
    assert all("call 2 of this writer never reached the sidecar" in str(r) for r in results)
    assert not sq._arrived and not sq._turns


# ---------------------------------------------------------------- fail()


@pytest.mark.asyncio
async def test_fail_refuses_every_later_call_of_the_session() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    waiting = await started(sq.enter(S1, 3, timeout_s=30))  # waits for 2
    err = WriterFailed("call 2 carried changes and was refused")
    sq.fail(S1, err)
    with pytest.raises(WriterFailed) as info:
        await asyncio.wait_for(waiting, 5)  # woken at once with the error
    assert info.value is err
    for seq in (2, 3, 4):
        with pytest.raises(WriterFailed):
            await sq.enter(S1, seq, timeout_s=30)
    # the first failure sticks: a later one does not replace it
    sq.fail(S1, CallLost("another failure"))
    with pytest.raises(WriterFailed):
        await sq.enter(S1, 5, timeout_s=30)
    # a reopened writer starts afresh
    applied: list[int] = []
    await _call(sq, S2, 1, applied)
    await _call(sq, S2, 2, applied)
    assert applied == [1, 2]


@pytest.mark.asyncio
async def test_fail_of_another_session_changes_nothing() -> None:
    sq = CallSequencer()
    applied: list[int] = []
    await _call(sq, S1, 1, applied)
    sq.fail(S2, WriterFailed("not the current session"))
    await _call(sq, S1, 2, applied)
    assert applied == [1, 2] and sq.lost is None


# ---------------------------------------------------------------- the registry's ordered calls


@pytest.mark.asyncio
async def test_the_registry_applies_calls_in_client_order_whatever_their_arrival() -> None:
    """Calls 4, 3, 2, 1 of a writer reach the registry in that order; the effects are 1-2-3-4.

    1 appends "first", 2 persists after SQN 0, 3 appends "second", 4 asks
    for the SQN boundary. Each call runs until it waits before the next one
    is sent, so the arrival order is exact. Applied as they arrive, call 3's
    change would get SQN 0 and land in call 2's handle, and call 1's SQN 1.
    """
    up = MemoryUploader()
    up.gate = asyncio.Event()  # the persist's upload runs until the test lets it end
    reg = registry(up, persist_delay_ms=0.0)
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    sent: dict[int, asyncio.Task[Any]] = {}
    sent[4] = await started(reg.last_appended_sqn(lid, session=S1, seq=4))
    sent[3] = await started(reg.append(lid, batch((1, [b"second"])), session=S1, seq=3))
    sent[2] = await started(reg.persist(lid, after=0, session=S1, seq=2))
    sent[1] = await started(reg.append(lid, batch((0, [b"first"])), session=S1, seq=1))
    assert await asyncio.wait_for(sent[1], 5) == 0
    # the persist's turn ended when its upload was queued: calls 3 and 4 run while it uploads
    assert await asyncio.wait_for(sent[3], 5) == 1
    assert await asyncio.wait_for(sent[4], 5) == 2
    assert not sent[2].done() and up.calls == 1
    up.gate.set()
    handle = await asyncio.wait_for(sent[2], 5)
    assert (handle.from_sqn, handle.to_sqn) == (0, 1)
    assert await read_handle(up, handle) == [(0, 0, [b"first"])]  # call 3's change is not in it
    later = await reg.persist(lid, after=handle.to_sqn, session=S1, seq=5)
    assert await read_handle(up, later) == [(1, 1, [b"second"])]


@pytest.mark.asyncio
async def test_truncate_waits_for_the_earlier_persist_of_its_session() -> None:
    """A truncate sent after an append and a persist does not drop what they carry."""
    up = MemoryUploader()
    reg = registry(up)
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    await reg.append(lid, batch((0, [b"old"])), session=S1, seq=1)
    assert await reg.last_appended_sqn(lid, session=S1, seq=2) == 1
    truncate = await started(reg.truncate(lid, before=1, session=S1, seq=5))
    persist = await started(reg.persist(lid, after=0, session=S1, seq=4))
    append = await started(reg.append(lid, batch((1, [b"new"])), session=S1, seq=3))
    handle = await asyncio.wait_for(persist, 5)
    await asyncio.wait_for(asyncio.gather(append, truncate), 5)
    # applied as they arrived, the truncate would have refused the persist after SQN 0
    assert await read_handle(up, handle) == [(0, 0, [b"old"]), (1, 1, [b"new"])]


@pytest.mark.asyncio
async def test_a_refused_call_with_changes_fails_its_session() -> None:
    reg = registry(MemoryUploader())
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    waiting = await started(reg.append(lid, batch((0, [b"later"])), session=S1, seq=2))
    with pytest.raises(KeyGroupOutOfRange):  # refused inside its turn
        await reg.append(lid, batch((9, [b"refused"])), session=S1, seq=1)
    with pytest.raises(WriterFailed, match=r"call 1 of writer \w+ carried changes and was refused"):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(WriterFailed):
        await reg.last_appended_sqn(lid, session=S1, seq=3)
    assert sample(reg.metrics, "dstl_sessions_failed_total") == 1
    assert reg.budget.used == 0  # nothing of the session was applied
    # a reopened writer object (a new session) starts afresh
    assert await reg.append(lid, batch((0, [b"again"])), session=S2, seq=1) == 0


@pytest.mark.asyncio
async def test_a_refused_call_without_changes_takes_its_turn_and_leaves_no_gap() -> None:
    reg = registry(MemoryUploader())
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    waiting = await started(reg.append(lid, batch((0, [b"next"])), session=S1, seq=2))
    with pytest.raises(SqnOutOfRange):
        await reg.truncate(lid, before=7, session=S1, seq=1)
    assert await asyncio.wait_for(waiting, 5) == 0
    with pytest.raises(InvalidArgument, match="empty append batch"):
        await reg.append(lid, [], session=S1, seq=3)
    assert await reg.last_appended_sqn(lid, session=S1, seq=4) == 1
    assert sample(reg.metrics, "dstl_sessions_failed_total") == 0


@pytest.mark.asyncio
async def test_too_many_parts_are_refused_in_the_turn_and_fail_the_session() -> None:
    reg = registry(MemoryUploader())
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    many = batch(*((kg % 4, [b"x"]) for kg in range(MAX_PARTS_PER_REQUEST + 1)))
    with pytest.raises(InvalidArgument, match=f"at most {MAX_PARTS_PER_REQUEST}"):
        await reg.append(lid, many, session=S1, seq=1)
    with pytest.raises(WriterFailed):
        await reg.append(lid, batch((0, [b"y"])), session=S1, seq=2)
    assert reg.budget.used == 0


@pytest.mark.asyncio
async def test_parked_bytes_count_in_the_one_memory_budget() -> None:
    """Bytes parked behind a missing call and bytes not yet uploaded share one bound."""
    limit = 64 * 1024
    up = MemoryUploader()
    up.gate = asyncio.Event()  # nothing gets uploaded: the budget stays full
    reg = registry(
        up, max_in_flight_bytes=limit, batch_size_threshold=limit, preemptive_persist_threshold=0
    )
    lid = reg.create_writer("job", "op", (0, 3)).log_id
    other = reg.create_writer("job", "op2", (0, 3)).log_id
    parked = await started(reg.append(lid, batch((0, [b"a" * 40_000])), session=S1, seq=2))
    held = 4 + 40_000 + PART_OVERHEAD_BYTES
    assert sample(reg.metrics, "dstl_parked_bytes") == held
    assert reg.budget.held == held and reg.budget.used == 0
    # room left: another writer's append gets in (overcommitting by one request)
    await reg.append(other, batch((1, [b"b" * 30_000])), session=S2, seq=1)
    assert reg.budget.total > limit
    # full, counting the parked call: refused at once, nothing applied, no session failed
    with pytest.raises(BudgetFull):
        await reg.append(other, batch((1, [b"c"])), session=S2, seq=2)
    with pytest.raises(BudgetFull):
        await reg.append(lid, batch((1, [b"d"])), session=S1, seq=3)
    assert sample(reg.metrics, "dstl_sessions_failed_total") == 0
    # the missing call arrives (no changes, no admission): the parked one lands
    await reg.last_appended_sqn(lid, session=S1, seq=1)
    await asyncio.wait_for(parked, 5)
    assert sample(reg.metrics, "dstl_parked_bytes") == 0
    assert reg.budget.held == 0
    assert reg.budget.used == held + 4 + 30_000 + PART_OVERHEAD_BYTES
    up.gate.set()
    # the refused calls are sent again with the same seq, as the client does (each
    # refusal asks for an upload of what waits): in order, none lost
    for log_id, session, seq, data in ((other, S2, 2, b"c"), (lid, S1, 3, b"d")):
        for _ in range(200):
            try:
                await reg.append(log_id, batch((1, [data])), session=session, seq=seq)
                break
            except BudgetFull:
                await asyncio.sleep(0.06)
        else:
            raise AssertionError("the budget never freed up")
    h = await reg.persist(lid, 0, session=S1, seq=4)
    got = [(kg, data) for kg, _sqn, data in await read_handle(up, h)]
    assert got == [(0, [b"a" * 40_000]), (1, [b"d"])]
