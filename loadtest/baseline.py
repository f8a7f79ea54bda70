"""The baseline: the same bytes written straight to the same store, no service.

Uses the server's own :class:`~dstl_server.storage.local.LocalBlobStore` with
the same fsync setting, on the same file system, so that
``service / baseline`` is the service's overhead as a ratio.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hdrh.histogram import HdrHistogram

from dstl_server.storage.local import LocalBlobStore

#: latency histograms are in microseconds, up to an hour
LATENCY_MAX_US = 3_600_000_000


def new_latency_histogram() -> HdrHistogram:
    return HdrHistogram(1, LATENCY_MAX_US, 3)


def _key() -> str:
    u = uuid.uuid4().hex
    return f"baseline/{u[:2]}/{u}.dstl"


@dataclass(frozen=True, slots=True)
class StoreThroughput:
    objects: int
    object_bytes: int
    seconds: float

    @property
    def total_bytes(self) -> int:
        return self.objects * self.object_bytes

    @property
    def mb_per_s(self) -> float:
        return self.total_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


async def _throughput(
    root: Path, fsync: bool, object_bytes: int, objects: int, concurrency: int
) -> StoreThroughput:
    store = LocalBlobStore(root, fsync=fsync)
    data = os.urandom(object_bytes)
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            await store.put(_key(), data)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(objects)))
        seconds = time.perf_counter() - t0
    finally:
        await store.close()
    return StoreThroughput(objects, object_bytes, seconds)


async def _latency(root: Path, fsync: bool, object_bytes: int, count: int) -> HdrHistogram:
    store = LocalBlobStore(root, fsync=fsync)
    data = os.urandom(object_bytes)
    hist = new_latency_histogram()
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            await store.put(_key(), data)
            hist.record_value(max(1, int((time.perf_counter() - t0) * 1e6)))
    finally:
        await store.close()
    return hist


def store_throughput(
    root: Path, *, fsync: bool, total_bytes: int, object_bytes: int, concurrency: int
) -> StoreThroughput:
    """Write ``total_bytes`` as objects of ``object_bytes``, ``concurrency`` at a time.

    The objects are removed afterwards (the time of that is not counted).
    """
    object_bytes = max(1, object_bytes)
    objects = max(1, -(-total_bytes // object_bytes))
    try:
        return asyncio.run(_throughput(root, fsync, object_bytes, objects, concurrency))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def store_put_latency(root: Path, *, fsync: bool, object_bytes: int, count: int) -> HdrHistogram:
    """Latency of ``count`` sequential puts of ``object_bytes`` each (microseconds)."""
    try:
        return asyncio.run(_latency(root, fsync, max(1, object_bytes), count))
    finally:
        shutil.rmtree(root, ignore_errors=True)
