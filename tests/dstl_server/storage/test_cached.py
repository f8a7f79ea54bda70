"""The read cache in front of a store: the same contract, plus what it keeps and drops."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dstl_client.core.errors import BlobNotFound, InvalidArgument, TransientStorageError
from dstl_server.metrics import ServerMetrics
from dstl_server.storage.base import BlobStore
from dstl_server.storage.cached import CachedBlobStore
from dstl_server.storage.local import LocalBlobStore
from tests.dstl_server.storage.contract import BlobStoreContract
from tests.fakes import MemoryBlobStore

MiB = 1 << 20


class TestCachedBlobStoreHoldingAll(BlobStoreContract):
    """Every object of the suite fits: reads of what was put come from memory."""

    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[BlobStore]:
        async with CachedBlobStore(LocalBlobStore(tmp_path, fsync=False), 256 * MiB) as s:
            yield s


class TestCachedBlobStoreEvicting(BlobStoreContract):
    """A small cache: the suite's larger objects and older ones are read from the store."""

    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[BlobStore]:
        inner = LocalBlobStore(tmp_path, fsync=False)
        async with CachedBlobStore(inner, 64 << 10, max_object_bytes=16 << 10) as s:
            yield s


@pytest.mark.asyncio
async def test_a_put_object_is_read_from_memory_until_this_store_deletes_it() -> None:
    inner = MemoryBlobStore()
    metrics = ServerMetrics()
    store = CachedBlobStore(inner, 1024, metrics=metrics)
    await store.put("j/a", b"0123456789")
    del inner.objects["j/a"]  # gone behind the cache's back: still served
    assert await store.get("j/a", 2, 3) == b"234"
    assert await store.get("j/a", 8) == b"89"
    assert await store.get("j/a", 8, 100) == b"89"  # past the end: fewer bytes, as stores do
    assert metrics.read_cache_hits._value.get() == 3
    assert metrics.read_cache_bytes._value.get() == 10
    await store.delete(["j/a"])
    with pytest.raises(BlobNotFound):
        await store.get("j/a")
    assert metrics.read_cache_misses._value.get() == 1
    assert metrics.read_cache_bytes._value.get() == 0 and store.cached_bytes == 0


@pytest.mark.asyncio
async def test_the_least_recently_used_object_leaves_first_and_the_bound_holds() -> None:
    store = CachedBlobStore(MemoryBlobStore(), 12)
    await store.put("j/a", b"aaaa")
    await store.put("j/b", b"bbbb")
    await store.put("j/c", b"cccc")
    await store.get("j/a")  # a is now more recent than b
    await store.put("j/d", b"dddd")
    assert "j/a" in store and "j/b" not in store and "j/c" in store and "j/d" in store
    assert store.cached_bytes == 12
    assert await store.get("j/b") == b"bbbb"  # from the store


@pytest.mark.asyncio
async def test_objects_over_the_size_limit_and_failed_puts_are_not_kept() -> None:
    inner = MemoryBlobStore([TransientStorageError("503")])
    store = CachedBlobStore(inner, 100, max_object_bytes=8)
    with pytest.raises(TransientStorageError):
        await store.put("j/failed", b"x")
    assert "j/failed" not in store
    await store.put("j/big", b"123456789")
    assert "j/big" not in store and store.cached_bytes == 0
    await store.put("j/replaced", b"old")
    await store.put("j/replaced", b"newer")
    assert await store.get("j/replaced") == b"newer" and store.cached_bytes == 5


@pytest.mark.asyncio
async def test_bad_keys_and_ranges_are_refused_for_cached_objects_too() -> None:
    store = CachedBlobStore(MemoryBlobStore(), 100)
    await store.put("j/a", b"abc")
    with pytest.raises(InvalidArgument):
        await store.get("j/a", -1, 2)
    with pytest.raises(InvalidArgument):
        await store.get("j/a", 0, -2)


def test_a_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        CachedBlobStore(MemoryBlobStore(), -1)
