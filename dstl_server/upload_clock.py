"""Injected time for the upload engine: a clock, a sleep, and the waits built on them.

The upload engine makes every time decision (hedge delay, attempt timeout,
backoff, deadline, discard batching, budget window) through one ``clock`` and
one ``sleep`` it is given, so a test can hand it a fake clock and run minutes
of timeouts in no wall-clock time. ``asyncio.wait_for`` and ``asyncio.wait``'s
``timeout`` read the event loop's own clock, so they are not used with a
timeout here: :func:`wait_first` and :func:`within` race the work against a
``sleep`` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

T = TypeVar("T")

#: seconds on a monotonic clock
Clock = Callable[[], float]
#: waits that many seconds of that clock
Sleep = Callable[[float], Awaitable[None]]


def loop_time() -> float:
    """The running event loop's clock (the default ``Clock``)."""
    return asyncio.get_running_loop().time()


async def wait_first(
    aws: Collection[asyncio.Future[Any]], timeout: float, sleep: Sleep
) -> set[asyncio.Future[Any]]:
    """Wait until one of ``aws`` is done or ``sleep(timeout)`` returns; the done ones.

    ``asyncio.wait(aws, timeout, FIRST_COMPLETED)`` on the injected clock: an
    empty set means the timeout came first. With no ``aws``, just sleeps.
    """
    timer: asyncio.Future[Any] = asyncio.ensure_future(sleep(max(0.0, timeout)))
    try:
        done, _ = await asyncio.wait({*aws, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
    done.discard(timer)
    return done


async def within(aw: Awaitable[T], timeout: float, sleep: Sleep) -> T:
    """``asyncio.wait_for(aw, timeout)`` on the injected clock.

    Past ``timeout`` the work is cancelled, waited for, and :class:`TimeoutError`
    raised (its result or error when it ended anyway). When the caller is
    cancelled, the work is cancelled too.
    """
    task = asyncio.ensure_future(aw)
    try:
        done = await wait_first((task,), timeout, sleep)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait((task,))
        if task.cancelled():
            raise TimeoutError
    return task.result()
