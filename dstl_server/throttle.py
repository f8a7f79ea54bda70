"""Bound on bytes held in the sidecar's memory and not yet uploaded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dstl_client.core.errors import Backpressure


class MemoryBudget:
    """Counts bytes appended and not yet uploaded, over every writer: the one count.

    Invariant: ``used`` is the sum over writers of what they hold in memory,
    as charged (data plus per-part overhead) by appends and not yet released
    by an upload, a truncate or a close. ``acquire`` lets a caller in while
    ``used < limit`` (one request may overcommit, as Flink's UploadThrottle
    does, so a change larger than the headroom never deadlocks) and otherwise
    waits, calling ``on_pressure`` so queued changes get uploaded and memory
    frees up. ``on_change`` gets ``used`` after every change (the
    ``dstl_unuploaded_bytes`` gauge). Event-loop only.
    """

    def __init__(
        self,
        limit: int,
        timeout_s: float,
        on_pressure: Callable[[], None],
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.used = 0
        self._on_pressure = on_pressure
        self._on_change = on_change
        #: set while ``used < limit``: waiters wake when room frees up
        self._room = asyncio.Event()
        self._room.set()

    @property
    def over(self) -> bool:
        return self.used >= self.limit

    async def acquire(self, nbytes: int) -> bool:
        """Account ``nbytes``; return True if the caller had to wait."""
        waited = False
        if self.used >= self.limit:
            waited = True
            self._on_pressure()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout_s
            while self.used >= self.limit:
                self._room.clear()
                try:
                    await asyncio.wait_for(self._room.wait(), deadline - loop.time())
                except TimeoutError:
                    raise Backpressure(
                        f"{self.used} bytes wait for upload (limit {self.limit}) for "
                        f"{self.timeout_s:.0f}s: the store is too slow or down"
                    ) from None
        self._add(nbytes)
        return waited

    def take(self, nbytes: int) -> None:
        """Account ``nbytes`` now, without waiting: for a caller that found room (not ``over``).

        What :meth:`acquire` does when there is room, without a coroutine.
        """
        self._add(nbytes)

    def release(self, nbytes: int) -> None:
        if not nbytes:
            return
        self._add(-nbytes)
        if self.used < self.limit:
            self._room.set()  # no task per release: waiters (if any) wake on the event

    def _add(self, nbytes: int) -> None:
        self.used += nbytes
        if self._on_change is not None:
            self._on_change(self.used)
