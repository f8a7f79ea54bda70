"""CallSequencer: one writer's calls are applied in the order the client made them."""

from __future__ import annotations

import asyncio
import time

import pytest

from dstl_client.core.errors import CallLost, InvalidArgument, WriterFailed
from dstl_server.log import CallSequencer

S1 = 11
S2 = 22


async def _call(
    seq_: CallSequencer, session: int, seq: int, log: list[int], hold: float = 0
) -> None:
    await seq_.enter(session, seq, timeout_s=1.0)
    try:
        log.append(seq)
        if hold:
            await asyncio.sleep(hold)
    finally:
        seq_.leave(session, seq)


async def test_calls_arriving_out_of_order_are_applied_in_order() -> None:
    sq = CallSequencer()
    applied: list[int] = []
    late = [asyncio.create_task(_call(sq, S1, n, applied)) for n in (4, 2, 3)]
    await asyncio.sleep(0.01)
    assert applied == []  # 2..4 wait for 1
    await _call(sq, S1, 1, applied)
    await asyncio.gather(*late)
    assert applied == [1, 2, 3, 4]


async def test_unordered_calls_do_not_wait() -> None:
    sq = CallSequencer()
    applied: list[int] = []
    await _call(sq, S1, 0, applied)
    assert applied == [0]


async def test_a_call_that_never_arrives_fails_the_session() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    with pytest.raises(CallLost, match="call 2 of this writer never reached"):
        await asyncio.wait_for(sq.enter(S1, 3, timeout_s=0.1), 5)
    # every later call of that session fails fast too
    with pytest.raises(CallLost):
        await sq.enter(S1, 4, timeout_s=0.1)


async def test_waiting_behind_an_arrived_slow_call_is_not_a_loss() -> None:
    sq = CallSequencer()
    applied: list[int] = []
    slow = asyncio.create_task(_call(sq, S1, 1, applied, hold=0.5))
    await asyncio.sleep(0.01)
    # call 2 waits longer than its 0.1 s timeout, but call 1 has arrived
    await asyncio.wait_for(sq.enter(S1, 2, timeout_s=0.1), 5)
    sq.leave(S1, 2)
    await slow
    assert sq.next_seq == 3


async def test_duplicate_call_is_refused() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    with pytest.raises(InvalidArgument, match="already received"):
        await sq.enter(S1, 1, timeout_s=0.1)


async def test_a_new_session_supersedes_the_old_one() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    stuck = asyncio.create_task(sq.enter(S1, 3, timeout_s=5))  # waits for 2
    await asyncio.sleep(0.01)
    applied: list[int] = []
    await _call(sq, S2, 1, applied)  # a reopened writer starts at 1
    assert applied == [1]
    with pytest.raises(CallLost, match="superseded"):
        await stuck
    with pytest.raises(CallLost, match="superseded"):
        await sq.enter(S1, 2, timeout_s=0.1)


# ---------------------------------------------------------------- bounds


@pytest.mark.parametrize("far", [2**62, 2**64 - 1])
async def test_a_call_far_ahead_fails_the_session_at_once(far: int) -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    waiting = asyncio.create_task(sq.enter(S1, 3, timeout_s=30))  # waits for 2
    await asyncio.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(CallLost, match=f"call {far} arrived while call 2 is the next"):
        await asyncio.wait_for(sq.enter(S1, far, timeout_s=30), 5)
    assert time.monotonic() - started < 1.0  # no waiting, no walk over the gap
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


async def test_max_ahead_boundary_follows_the_next_expected_call() -> None:
    sq = CallSequencer()
    for n in range(1, 6):
        await _call(sq, S1, n, [])
    assert sq.next_seq == 6
    last_allowed = 6 + CallSequencer.MAX_AHEAD - 1
    waiting = asyncio.create_task(sq.enter(S1, last_allowed, timeout_s=30))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # within the window: it waits for its turn
    with pytest.raises(CallLost, match=f"at most {CallSequencer.MAX_AHEAD} calls"):
        await sq.enter(S1, last_allowed + 1, timeout_s=30)
    with pytest.raises(CallLost):
        await asyncio.wait_for(waiting, 5)


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


async def test_fail_refuses_every_later_call_of_the_session() -> None:
    sq = CallSequencer()
    await _call(sq, S1, 1, [])
    waiting = asyncio.create_task(sq.enter(S1, 3, timeout_s=30))  # waits for 2
    await asyncio.sleep(0.01)
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


async def test_fail_of_another_session_changes_nothing() -> None:
    sq = CallSequencer()
    applied: list[int] = []
    await _call(sq, S1, 1, applied)
    sq.fail(S2, WriterFailed("not the current session"))
    await _call(sq, S1, 2, applied)
    assert applied == [1, 2] and sq.lost is None
