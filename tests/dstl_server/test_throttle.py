"""MemoryBudget: one bound on the change bytes held, refusals instead of waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from dstl_client.core.errors import Backpressure, BudgetFull
from dstl_server.throttle import READ_TURN_S, MemoryBudget
from tests.fakes import ManualClock, settle


class Pressure:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


@pytest.mark.asyncio
async def test_acquire_below_the_limit_does_not_wait() -> None:
    pressure = Pressure()
    budget = MemoryBudget(1000, 1.0, pressure)
    assert await budget.acquire(400) is False
    assert await budget.acquire(599) is False
    assert budget.used == 999 and not budget.over
    assert pressure.calls == 0


@pytest.mark.asyncio
async def test_one_request_may_overcommit() -> None:
    """A request larger than the headroom gets in, so a big change never deadlocks."""
    budget = MemoryBudget(1000, 1.0, Pressure())
    assert await budget.acquire(999) is False
    assert await budget.acquire(5000) is False
    assert budget.used == 5999 and budget.over


async def other_call(budget: MemoryBudget, nbytes: int) -> None:
    budget.take(nbytes)


@pytest.mark.asyncio
async def test_over_the_limit_is_refused_at_once_and_holds_nothing() -> None:
    pressure = Pressure()
    budget = MemoryBudget(100, 10.0, pressure)
    await budget.acquire(100)
    started = time.monotonic()
    with pytest.raises(BudgetFull, match="limit 100"):
        await budget.acquire(1)
    with pytest.raises(BudgetFull):
        budget.check_room("w1")
    assert time.monotonic() - started < 1.0  # nothing waited holding its request
    assert pressure.calls == 1  # asked the registry to upload what waits (rate-limited)
    assert budget.used == 100 and budget.held == 0  # the refused requests took nothing


def test_admitted_calls_hold_their_bytes_in_the_same_bound() -> None:
    """Bytes of admitted calls not yet appended count with those not yet uploaded."""
    budget = MemoryBudget(100, 10.0, Pressure())
    budget.take(40)
    with budget.admitted(50, "w1"):  # e.g. parked behind an earlier call
        assert budget.held == 50 and budget.total == 90 and not budget.over
        with budget.admitted(30, "w2"):  # room before it: may overcommit by one request
            assert budget.total == 120 > budget.limit
            with pytest.raises(BudgetFull):  # no room for a third
                budget.check_room("w3")
            budget.take(30)  # w2's append takes over its hold: no double count
            assert budget.used == 70 and budget.held == 50
        assert budget.held == 50
    assert budget.held == 0 and budget.used == 70  # w1's call ended without appending


@pytest.mark.asyncio
async def test_an_admitted_call_appends_even_over_the_limit() -> None:
    budget = MemoryBudget(100, 10.0, Pressure())
    with budget.admitted(60, "w1"):
        await asyncio.create_task(other_call(budget, 70))  # filled the budget meanwhile
        assert budget.used == 70 and budget.held == 60  # the other task took no hold
        assert budget.total > budget.limit
        with pytest.raises(BudgetFull):  # no room for a new call
            await asyncio.create_task(budget.acquire(1))
        assert await budget.acquire(60) is False  # its bytes were counted: no refusal
    assert budget.used == 130 and budget.held == 0


def test_a_writer_pushed_back_past_the_timeout_gets_backpressure() -> None:
    clock = ManualClock()
    budget = MemoryBudget(100, 5.0, Pressure(), clock=clock)
    budget.take(100)
    with pytest.raises(BudgetFull):
        budget.check_room("w1")
    clock.now += 4.9
    with pytest.raises(BudgetFull):
        budget.check_room("w1")
    with pytest.raises(BudgetFull):  # another writer's clock starts now
        budget.check_room("w2")
    clock.now += 0.2
    with pytest.raises(Backpressure, match=r"pushed back for 5\.1s") as info:
        budget.check_room("w1")
    assert not isinstance(info.value, BudgetFull)
    with pytest.raises(BudgetFull):
        budget.check_room("w2")
    budget.release(50)
    budget.check_room("w2")  # admitted: its clock is reset
    budget.take(50)
    clock.now += 4.0
    with pytest.raises(BudgetFull):
        budget.check_room("w2")


@pytest.mark.asyncio
async def test_release_without_waiters() -> None:
    budget = MemoryBudget(100, 1.0, Pressure())
    await budget.acquire(60)
    budget.release(60)
    await settle()  # the release's wake-up task ran and found no waiter
    assert budget.used == 0
    assert await budget.acquire(10) is False


# ---------------------------------------------------------------- read turns (Session streams)


@pytest.mark.asyncio
async def test_streams_read_one_after_another_while_the_budget_cannot_take_more() -> None:
    """A stream reads its next request only when the budget has room for it: the others
    wait in line (their requests stay on the client), first come first served."""
    pressure = Pressure()
    budget = MemoryBudget(100, 10.0, pressure)
    budget.take(100)  # full: e.g. an upload the store does not take
    assert budget.read_turn_now(50) is None
    first = asyncio.create_task(budget.wait_read_turn("w1", 100))
    second = asyncio.create_task(budget.wait_read_turn("w2", 100))
    await settle()
    assert not first.done() and not second.done()
    assert pressure.calls == 1  # full: what waits for upload is pushed out
    budget.release(100)  # uploaded
    await settle()
    assert first.done() and not second.done()  # w1 holds room for its request
    turn = first.result()
    assert turn.granted and budget.reading == 100
    turn.done()  # its request was admitted (or carried nothing)
    await settle()
    assert second.done() and second.result().granted
    second.result().done()
    assert budget.reading == 0
    turn.done()  # idempotent
    assert budget.reading == 0


@pytest.mark.asyncio
async def test_an_idle_streams_turn_gives_its_room_back_by_itself() -> None:
    budget = MemoryBudget(100, 10.0, Pressure())
    idle = budget.read_turn_now(100)  # no request comes on that stream
    assert idle is not None and idle.granted
    waiting = asyncio.create_task(budget.wait_read_turn("w2", 10))
    await settle()
    assert not waiting.done()
    started = time.monotonic()
    turn = await asyncio.wait_for(waiting, 5)
    assert turn.granted
    assert time.monotonic() - started >= READ_TURN_S * 0.9
    turn.done()
    assert budget.reading == 0


@pytest.mark.asyncio
async def test_room_held_for_readers_is_not_pressure() -> None:
    """A reader waiting behind another's turn, with the budget itself below its limit,
    does not push every writer's changes out (that would upload them early)."""
    pressure = Pressure()
    budget = MemoryBudget(100, 10.0, pressure)
    first = budget.read_turn_now(100)
    assert first is not None
    waiting = asyncio.create_task(budget.wait_read_turn("w2", 10))
    await settle()
    assert pressure.calls == 0
    first.done()
    (await waiting).done()


@pytest.mark.asyncio
async def test_a_stream_waits_no_longer_than_its_writers_backpressure_timeout() -> None:
    """Past backpressure_timeout_s the stream reads anyway: its request, if still
    refused, gets a plain Backpressure (the clock ran from the start of the wait)."""
    budget = MemoryBudget(100, 0.2, Pressure())
    budget.take(100)
    started = time.monotonic()
    turn = await budget.wait_read_turn("w1", 10)
    assert not turn.granted
    assert 0.15 <= time.monotonic() - started < 2.0
    assert budget.reading == 0
    with pytest.raises(Backpressure) as info:  # pushed back since the wait began
        budget.check_room("w1")
    assert not isinstance(info.value, BudgetFull)
    # a stream that was idle while it waited: its writer was not pushed back
    turn = await budget.wait_read_turn("w2", 10)
    budget.forget("w2")
    with pytest.raises(BudgetFull):
        budget.check_room("w2")


@pytest.mark.asyncio
async def test_a_cancelled_wait_leaves_the_line() -> None:
    budget = MemoryBudget(100, 10.0, Pressure())
    budget.take(100)
    gone = asyncio.create_task(budget.wait_read_turn("w1", 100))
    stays = asyncio.create_task(budget.wait_read_turn("w2", 100))
    await settle()
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    budget.release(100)
    turn = await asyncio.wait_for(stays, 5)
    assert turn.granted and budget.reading == 100  # w1 took no room
    turn.done()
