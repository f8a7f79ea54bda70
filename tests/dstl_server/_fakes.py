"""In-memory stand-ins for unit tests of the registry, scheduler and uploader.

The integration tests run the same code against real stores and processes;
these fakes only make failures, stalls and call counts easy to script.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import TransientStorageError
from dstl_client.core.format import PackedChanges, pack_changes
from dstl_client.core.handle import ChangelogHandle
from dstl_client.core.keys import new_object_key
from dstl_client.core.reader import HandleReader
from dstl_server.metrics import ServerMetrics
from dstl_server.registry import LogRegistry
from dstl_server.settings import ServerSettings
from dstl_server.storage.base import BlobInfo, BlobStore
from dstl_server.uploader import Uploader


class MemoryUploader(Uploader):
    """Keeps objects in a dict. ``gate`` (when set) holds uploads until it opens;
    ``fail_next`` makes that many uploads fail with a transient error."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls = 0
        self.jobs: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail_next = 0
        self.running = 0
        self.max_running = 0

    async def upload(self, job_id: str, data: bytes) -> str:
        self.calls += 1
        self.jobs.append(job_id)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail_next:
                self.fail_next -= 1
                raise TransientStorageError("injected upload failure")
            key = new_object_key(job_id)
            self.objects[key] = data
            return key
        finally:
            self.running -= 1

    async def fetch(self, key: str, offset: int, length: int) -> bytes:
        return self.objects[key][offset : offset + length]


def settings(**overrides: Any) -> ServerSettings:
    """Unit-test settings: no network, tiny persist delay unless overridden."""
    values: dict[str, Any] = {"persist_delay_ms": 5.0}
    values.update(overrides)
    return ServerSettings(**values)


def registry(uploader: MemoryUploader, **overrides: Any) -> LogRegistry:
    return LogRegistry(settings(**overrides), uploader, ServerMetrics())


def part(key_group: int, packed: PackedChanges) -> pb.KeyGroupChanges:
    """One part as a call carries it (what the service hands the registry)."""
    return pb.KeyGroupChanges(
        key_group=key_group, count=packed.count, sizes=packed.sizes, payload=packed.payload
    )


def batch(*items: tuple[int, Sequence[bytes]]) -> list[pb.KeyGroupChanges]:
    """Append batches: (key group, changes) -> one packed part per key group."""
    return [part(kg, pack_changes(list(changes))) for kg, changes in items]


async def read_handle(
    uploader: MemoryUploader, handle: ChangelogHandle, key_groups: Iterable[int] | None = None
) -> list[tuple[int, int, list[bytes]]]:
    """(key group, SQN, changes) of a handle, read through the real reader."""
    reader = HandleReader(uploader.fetch)
    return [(v.key_group, v.sqn, v.changes()) async for v in reader.read(handle, key_groups)]


def sample(metrics: ServerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


class ScriptedStore(BlobStore):
    """A blob store whose puts follow a script of outcomes.

    Each put pops the next outcome: ``None`` succeeds, an exception instance
    is raised, ``"hang"`` stores the data and then never returns (a request
    that reached the store but whose answer is lost).
    """

    def __init__(self, script: Iterable[BaseException | str | None] = ()) -> None:
        self.script = list(script)
        self.objects: dict[str, bytes] = {}
        self.put_keys: list[str] = []
        self.deleted: list[str] = []

    async def put(self, key: str, data: bytes) -> None:
        self.put_keys.append(key)
        outcome = self.script.pop(0) if self.script else None
        if isinstance(outcome, BaseException):
            raise outcome
        self.objects[key] = data
        if outcome == "hang":
            await asyncio.sleep(3600)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        data = self.objects[key]
        return data[offset:] if length is None else data[offset : offset + length]

    async def delete(self, keys: Sequence[str]) -> int:
        self.deleted.extend(keys)
        n = 0
        for k in keys:
            if self.objects.pop(k, None) is not None:
                n += 1
        return n

    async def list(self, prefix: str = "") -> AsyncIterator[BlobInfo]:
        for key in sorted(self.objects):
            if key.startswith(prefix):
                yield BlobInfo(key, len(self.objects[key]))


class FakeClock:
    """Virtual time: ``time`` and ``sleep`` to inject into the code under test.

    Time stands still while any task can run; once every task waits, it jumps
    to the end of the earliest :meth:`sleep` and wakes the sleepers due then.
    Minutes of timeouts run in milliseconds and elapsed times are exact. Real
    timers (``asyncio.sleep``) do not count as work: time jumps past them.
    One clock per test; close what sleeps on it before the test ends (a task
    waiting on a fake sleep is kept alive by nothing but this clock).
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0
        self._driver: asyncio.Task[None] | None = None

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._seq += 1
        heapq.heappush(self._sleepers, (self.now + max(0.0, seconds), self._seq, fut))
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive())
        await fut  # a cancelled sleep cancels fut, which the driver skips

    async def _drive(self) -> None:
        while True:
            await _settle()
            while self._sleepers and self._sleepers[0][2].done():
                heapq.heappop(self._sleepers)
            if not self._sleepers:
                return
            self.now = max(self.now, self._sleepers[0][0])
            while self._sleepers and self._sleepers[0][0] <= self.now:
                fut = heapq.heappop(self._sleepers)[2]
                if not fut.done():
                    fut.set_result(None)


async def _settle() -> None:
    """Yield until no other callback is ready to run (every task waits)."""
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    quiet = 0
    for _ in range(10_000):
        await asyncio.sleep(0)
        if ready is None:  # a loop without the attribute: a fixed number of turns
            quiet += 1
            if quiet >= 50:
                return
        elif len(ready) == 0:
            quiet += 1
            if quiet >= 3:
                return
        else:
            quiet = 0
