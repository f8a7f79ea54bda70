"""The one set of in-memory stand-ins for unit tests.

* :class:`MemoryBlobStore`: a blob store in a dict that passes the same
  contract suite as the real stores (``tests/dstl_server/storage/test_memory.py``),
  with hooks to script put latencies (on a :class:`FakeClock`), failures,
  lost answers and failing or stuck deletes.
* :class:`FakeClock`: virtual time to inject as ``clock``/``sleep``.
* :class:`MemoryUploader`: an :class:`~dstl_server.uploader.Uploader` for
  unit tests of the registry, gated and made to fail on demand.
* Small helpers: unit-test settings and registries, packed parts, reading a
  handle back, metric samples.

The integration tests run the same code against real stores and processes;
these fakes only make failures, stalls and call counts easy to script. A fake
is fine for a unit test of one class only because it keeps the contract of
what it stands in for.
"""

from __future__ import annotations

import asyncio
import builtins
import heapq
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Literal

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import BlobNotFound, InvalidArgument, TransientStorageError
from dstl_client.core.format import PackedChanges, pack_changes
from dstl_client.core.handle import ChangelogHandle
from dstl_client.core.keys import new_object_key
from dstl_client.core.reader import HandleReader
from dstl_server.metrics import ServerMetrics
from dstl_server.registry import LogRegistry
from dstl_server.settings import ServerSettings
from dstl_server.storage.base import BlobInfo, BlobStore, validate_key
from dstl_server.uploader import Uploader

# ------------------------------------------------------------------ the clock


class ManualClock:
    """A clock that moves only when the test sets ``now`` (or calls :meth:`advance`).

    Pass the instance itself where the code under test takes ``clock=`` (a
    ``Callable[[], float]``). Reading ``now`` from other threads is safe (a
    float attribute); the test thread alone moves it.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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
            await settle()
            while self._sleepers and self._sleepers[0][2].done():
                heapq.heappop(self._sleepers)
            if not self._sleepers:
                return
            self.now = max(self.now, self._sleepers[0][0])
            while self._sleepers and self._sleepers[0][0] <= self.now:
                fut = heapq.heappop(self._sleepers)[2]
                if not fut.done():
                    fut.set_result(None)


async def settle() -> None:
    """Yield until no other callback is ready to run: every task waits (on an event,
    a future or a timer). A deterministic "let everything that can run, run"."""
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


async def forever() -> None:
    """Wait until cancelled (a request whose answer never comes)."""
    await asyncio.get_running_loop().create_future()


# ------------------------------------------------------------ the blob store

#: what a put does once its latency has passed: ``None`` stores the object and
#: returns; an exception is raised (nothing stored); ``"hang"`` stores the
#: object and never returns (a request that reached the store, answer lost)
Outcome = BaseException | Literal["hang"] | None
#: put number ``n`` (0-based) -> (its latency in fake-clock seconds, its outcome)
Plan = Callable[[int], tuple[float, Outcome]]


def scripted(*outcomes: Outcome) -> Plan:
    """Put ``n`` has no latency and ``outcomes[n]`` (then every put succeeds)."""
    return lambda n: (0.0, outcomes[n] if n < len(outcomes) else None)


def latencies(*delays: float, then: float = 0.0) -> Plan:
    """Put ``n`` takes ``delays[n]`` seconds (``then`` afterwards), all succeed."""
    return lambda n: (delays[n] if n < len(delays) else then, None)


class MemoryBlobStore(BlobStore):
    """A blob store in a dict, with scripted latencies and failures.

    It keeps the contract of :class:`~dstl_server.storage.base.BlobStore`
    (checked by the contract suite): keys are validated, puts are atomic (an
    object appears when its put has run its latency), ranged gets are clamped
    to the object, ``list`` honours ``prefix`` and ``start_after`` and reports
    each write's wall-clock time, ``delete`` counts the keys that existed.

    Scripting, by put number: ``plan`` (or ``script``, outcomes without
    latency) says how long each put takes on ``clock`` and how it ends. A put
    with no latency does not touch the clock. ``fail_deletes`` makes that many
    delete calls fail with a transient error; ``hang_deletes`` makes every
    delete wait until cancelled. What happened is recorded: ``put_keys`` (every
    put, in call order), ``finished`` (puts that returned or raised),
    ``cancelled`` (puts cancelled during their latency), ``deleted`` (every key
    asked to be deleted by a call that did not fail) and ``delete_calls``.
    """

    url = "mem://"

    def __init__(
        self,
        script: Iterable[Outcome] = (),
        *,
        plan: Plan | None = None,
        clock: FakeClock | None = None,
        fail_deletes: int = 0,
        hang_deletes: bool = False,
    ) -> None:
        self.plan = plan if plan is not None else scripted(*script)
        self.clock = clock if clock is not None else FakeClock()
        self.fail_deletes = fail_deletes
        self.hang_deletes = hang_deletes
        self.objects: dict[str, bytes] = {}
        self.modified: dict[str, float] = {}
        self.put_keys: builtins.list[str] = []
        self.finished: builtins.list[str] = []
        self.cancelled: builtins.list[str] = []
        self.deleted: builtins.list[str] = []
        self.delete_calls = 0

    async def put(self, key: str, data: bytes) -> None:
        validate_key(key)
        n = len(self.put_keys)
        self.put_keys.append(key)
        delay, outcome = self.plan(n)
        if delay > 0:
            try:
                await self.clock.sleep(delay)
            except asyncio.CancelledError:
                self.cancelled.append(key)
                raise
        if isinstance(outcome, BaseException):
            self.finished.append(key)
            raise outcome
        self.objects[key] = bytes(data)
        self.modified[key] = time.time()
        if outcome == "hang":
            await forever()
        self.finished.append(key)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        validate_key(key)
        if offset < 0 or (length is not None and length < 0):
            raise InvalidArgument(f"bad range offset={offset} length={length}")
        try:
            data = self.objects[key]
        except KeyError:
            raise BlobNotFound(f"no object {key} in {self.url}") from None
        return data[offset:] if length is None else data[offset : offset + length]

    async def delete(self, keys: Sequence[str]) -> int:
        for key in keys:
            validate_key(key)
        self.delete_calls += 1
        if self.fail_deletes:
            self.fail_deletes -= 1
            raise TransientStorageError("503 SlowDown (delete)")
        if self.hang_deletes:
            await forever()
        self.deleted.extend(keys)
        n = 0
        for key in keys:
            if self.objects.pop(key, None) is not None:
                del self.modified[key]
                n += 1
        return n

    async def list(self, prefix: str = "", start_after: str = "") -> AsyncIterator[BlobInfo]:
        chosen = sorted(k for k in self.objects if k.startswith(prefix) and k > start_after)
        for key in chosen:
            data = self.objects.get(key)
            if data is not None:  # not deleted while the caller iterated
                yield BlobInfo(key, len(data), self.modified[key])


# ----------------------------------------------------------------- the uploader


class MemoryUploader(Uploader):
    """Keeps objects in a dict. ``gate`` (when set) holds uploads until it opens;
    ``fail_next`` makes that many uploads fail with a transient error.
    :meth:`until` waits for a state the uploads lead to."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls = 0
        self.jobs: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail_next = 0
        self.running = 0
        self.max_running = 0
        self._progress = asyncio.Event()  # set (and replaced) when an upload starts or ends

    def _moved(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def until(self, cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Return once ``cond()`` holds, checked whenever the loop has settled after an
        upload started or ended (what the registry does next to an upload included)."""
        async with asyncio.timeout(timeout_s):
            while True:
                await settle()
                if cond():
                    return
                await self._progress.wait()

    async def upload(self, job_id: str, data: bytes) -> str:
        self.calls += 1
        self.jobs.append(job_id)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self._moved()
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
            self._moved()

    async def fetch(self, key: str, offset: int, length: int) -> bytes:
        return self.objects[key][offset : offset + length]


# ------------------------------------------------------------------- helpers


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
    """A metric's value; 0 when it was never set."""
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# ------------------------------------------------------------ job metadata

import threading  # noqa: E402 - appended section: the driver's metadata store fake

from dstl_client.coordinator.metadata import (  # noqa: E402
    MetadataStore,
    check_name,
    check_prefix,
)


class MemoryMetadataStore(MetadataStore):
    """The driver's job metadata in a dict; passes the same contract suite as the real
    stores (``tests/dstl_client/coordinator/test_metadata_store.py``).

    ``objects`` maps names to bytes; ``calls`` counts operations by name. Two
    coordinators given one instance share it like two drivers sharing a bucket.
    Thread-safe (one lock).
    """

    def __init__(self, url: str = "memory://job") -> None:
        self._url = url
        self._lock = threading.Lock()
        self.objects: dict[str, bytes] = {}
        self.calls: dict[str, int] = {}

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    @property
    def url(self) -> str:
        return self._url

    def put_once(self, name: str, data: bytes) -> bool:
        check_name(name)
        with self._lock:
            self._count("put_once")
            if name in self.objects:
                return False
            self.objects[name] = bytes(data)
            return True

    def put(self, name: str, data: bytes) -> None:
        check_name(name)
        with self._lock:
            self._count("put")
            self.objects[name] = bytes(data)

    def get(self, name: str) -> bytes | None:
        check_name(name)
        with self._lock:
            self._count("get")
            return self.objects.get(name)

    def list(self, prefix: str = "") -> builtins.list[str]:
        check_prefix(prefix)
        with self._lock:
            self._count("list")
            return sorted(n for n in self.objects if n.startswith(prefix))

    def delete(self, name: str) -> None:
        check_name(name)
        with self._lock:
            self._count("delete")
            self.objects.pop(name, None)
