"""MemoryBudget: bounded bytes appended-not-uploaded, with backpressure."""

from __future__ import annotations

import asyncio
import time

import pytest

from dstl_client.core.errors import Backpressure
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


@pytest.mark.asyncio
async def test_over_the_limit_times_out_with_backpressure() -> None:
    pressure = Pressure()
    budget = MemoryBudget(100, 0.1, pressure)
    await budget.acquire(100)
    started = time.monotonic()
    with pytest.raises(Backpressure, match="limit 100"):
        await budget.acquire(1)
    assert time.monotonic() - started >= 0.09
    assert pressure.calls == 1  # asked the registry to upload what waits
    assert budget.used == 100  # the refused request took nothing


@pytest.mark.asyncio
async def test_release_wakes_waiters() -> None:
    pressure = Pressure()
    budget = MemoryBudget(100, 10.0, pressure)
    await budget.acquire(150)
    waiters = [asyncio.create_task(budget.acquire(10)) for _ in range(3)]
    await settle()  # every waiter has run up to its wait
    assert not any(w.done() for w in waiters)
    assert pressure.calls == 3
    budget.release(100)  # used 50 < limit
    results = await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert results == [True, True, True]
    assert budget.used == 80


@pytest.mark.asyncio
async def test_partial_release_keeps_waiting() -> None:
    budget = MemoryBudget(100, 10.0, Pressure())
    await budget.acquire(200)
    waiter = asyncio.create_task(budget.acquire(1))
    budget.release(50)  # 150: still over
    await settle()  # the release's wake-up has run: the waiter checked and waits on
    assert not waiter.done()
    budget.release(60)  # 90
    assert await asyncio.wait_for(waiter, 5) is True
    assert budget.used == 91


@pytest.mark.asyncio
async def test_release_without_waiters() -> None:
    budget = MemoryBudget(100, 1.0, Pressure())
    await budget.acquire(60)
    budget.release(60)
    await settle()  # the release's wake-up task ran and found no waiter
    assert budget.used == 0
    assert await budget.acquire(10) is False
