"""The in-memory fake store of ``tests/fakes.py``: the same contract as the real stores.

Unit tests may stand a :class:`MemoryBlobStore` in for a real store only
because it passes the suite below; its scripting hooks are checked here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from dstl_client.core.errors import TransientStorageError
from dstl_server.storage.base import BlobStore
from tests.dstl_server.storage.contract import BlobStoreContract
from tests.fakes import FakeClock, MemoryBlobStore, latencies


class TestMemoryBlobStore(BlobStoreContract):
    @pytest_asyncio.fixture
    async def store(self) -> AsyncIterator[BlobStore]:
        async with MemoryBlobStore() as s:
            yield s


@pytest.mark.asyncio
async def test_scripted_outcomes_by_put_number() -> None:
    store = MemoryBlobStore([TransientStorageError("503"), "hang", None])
    with pytest.raises(TransientStorageError):
        await store.put("a", b"1")
    hung = asyncio.ensure_future(store.put("b", b"2"))
    await asyncio.sleep(0)
    assert store.objects == {"b": b"2"} and not hung.done()  # landed, answer lost
    hung.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hung
    await store.put("c", b"3")
    await store.put("d", b"4")  # past the script: success
    assert store.put_keys == ["a", "b", "c", "d"]
    assert store.finished == ["a", "c", "d"]
    assert sorted(store.objects) == ["b", "c", "d"]


@pytest.mark.asyncio
async def test_put_latency_runs_on_the_fake_clock() -> None:
    clock = FakeClock()
    store = MemoryBlobStore(plan=latencies(2.0, 0.5), clock=clock)
    slow = asyncio.ensure_future(store.put("slow", b"s"))
    await asyncio.sleep(0)  # the slow put starts first: put number 0
    await store.put("fast", b"f")
    assert clock.time() == 1000.5 and "slow" not in store.objects  # atomic: not yet there
    await slow
    assert clock.time() == 1002.0 and store.finished == ["fast", "slow"]
    store.plan = latencies(then=1.0)
    cancelled = asyncio.ensure_future(store.put("never", b"n"))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert store.cancelled == ["never"] and "never" not in store.objects


@pytest.mark.asyncio
async def test_failing_and_hanging_deletes() -> None:
    store = MemoryBlobStore(fail_deletes=1)
    await store.put("k", b"v")
    with pytest.raises(TransientStorageError):
        await store.delete(["k"])
    assert store.deleted == [] and store.delete_calls == 1
    assert await store.delete(["k"]) == 1
    store.hang_deletes = True
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(store.delete(["k"]), 0.01)
    assert store.delete_calls == 3
