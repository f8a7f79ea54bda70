"""MemoryBudget: one bound on the change bytes held, refusals instead of waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from dstl_client.core.errors import Backpressure, BudgetFull
from dstl_server.throttle import MemoryBudget
from tests.fakes import settle


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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
    clock = Clock()
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
