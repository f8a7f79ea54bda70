"""CallSequencer: one writer's calls are applied in the order the client made them."""

from __future__ import annotations

import asyncio

import pytest

from dstl_client.errors import CallLost, InvalidArgument
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
