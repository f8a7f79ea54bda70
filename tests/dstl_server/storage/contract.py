"""The contract every :class:`~dstl_server.storage.base.BlobStore` must pass.

A store's test module subclasses :class:`BlobStoreContract` and provides an
async ``store`` fixture yielding an open store::

    class TestMyStore(BlobStoreContract):
        @pytest_asyncio.fixture
        async def store(self) -> AsyncIterator[BlobStore]:
            async with MyStore(...) as s:
                yield s

The tests make no file-system assumptions and write only under a fresh,
unique key prefix per test, so a store backed by a shared bucket can run them
side by side. Objects are never empty here: the sidecar never writes an empty
object (every object has a header and a footer), so stores need not support it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncGenerator

import pytest

from dstl_client.core.errors import BlobNotFound, InvalidArgument
from dstl_server.storage.base import BlobInfo, BlobStore

MiB = 1024 * 1024


async def _listed(store: BlobStore, prefix: str) -> list[BlobInfo]:
    return [info async for info in store.list(prefix)]


class BlobStoreContract:
    """Behaviour of ``put``/``get``/``delete``/``list``/``probe``/``sweep_leftovers``
    from ``storage/base.py``."""

    #: stores that can tell how many keys existed return exactly that from ``delete``
    delete_counts_existing: bool = True

    @pytest.fixture
    def prefix(self) -> str:
        """A key prefix no other test (or test run) uses."""
        return f"contract-{uuid.uuid4().hex[:16]}/"

    # ------------------------------------------------------------ put / get
    @pytest.mark.asyncio
    async def test_roundtrip_small(self, store: BlobStore, prefix: str) -> None:
        await store.put(prefix + "one", b"x")
        await store.put(prefix + "two", b"hello, blob")
        assert await store.get(prefix + "one") == b"x"
        assert await store.get(prefix + "two") == b"hello, blob"

    @pytest.mark.asyncio
    async def test_roundtrip_large(self, store: BlobStore, prefix: str) -> None:
        data = os.urandom(5 * MiB + 123)
        await store.put(prefix + "big", data)
        assert await store.get(prefix + "big") == data
        # a range in the middle of a large object
        assert (
            await store.get(prefix + "big", 3 * MiB + 7, 1 * MiB) == data[3 * MiB + 7 : 4 * MiB + 7]
        )

    @pytest.mark.asyncio
    async def test_binary_content_is_preserved(self, store: BlobStore, prefix: str) -> None:
        data = bytes(range(256)) * 17
        await store.put(prefix + "bin", data)
        assert await store.get(prefix + "bin") == data

    @pytest.mark.asyncio
    async def test_ranged_get(self, store: BlobStore, prefix: str) -> None:
        data = bytes(range(200))
        key = prefix + "ranged"
        await store.put(key, data)
        assert await store.get(key, 0, 1) == data[:1]
        assert await store.get(key, 10, 20) == data[10:30]
        assert await store.get(key, 199, 1) == data[199:]
        # offset without length reads to the end
        assert await store.get(key, 150) == data[150:]
        assert await store.get(key, 0, None) == data
        assert await store.get(key, 0, 200) == data

    @pytest.mark.asyncio
    async def test_ranged_get_past_the_end(self, store: BlobStore, prefix: str) -> None:
        data = b"0123456789"
        key = prefix + "short"
        await store.put(key, data)
        # a range reaching past the end returns the bytes that exist
        assert await store.get(key, 5, 100) == b"56789"
        # a range starting at or past the end returns nothing
        assert await store.get(key, 10, 5) == b""
        assert await store.get(key, 50, 5) == b""

    @pytest.mark.asyncio
    async def test_huge_ranges_cost_only_what_exists(self, store: BlobStore, prefix: str) -> None:
        """A caller's huge length never sizes an allocation: the answer is what exists."""
        key = prefix + "tiny"
        await store.put(key, b"abc")
        assert await store.get(key, 1, 1 << 40) == b"bc"
        assert await store.get(key, 0, 1 << 34) == b"abc"
        assert await store.get(key, 1 << 40, 1 << 34) == b""

    @pytest.mark.asyncio
    async def test_negative_ranges_are_invalid(self, store: BlobStore, prefix: str) -> None:
        """A negative offset or length is the caller's error, never a retryable one."""
        await store.put(prefix + "k", b"data")
        for offset, length in ((-1, None), (-1, 2), (0, -1)):
            with pytest.raises(InvalidArgument):
                await store.get(prefix + "k", offset, length)

    @pytest.mark.asyncio
    async def test_get_missing_key(self, store: BlobStore, prefix: str) -> None:
        with pytest.raises(BlobNotFound):
            await store.get(prefix + "missing")
        with pytest.raises(BlobNotFound):
            await store.get(prefix + "missing", 10, 10)
        assert not BlobNotFound("x").retryable

    @pytest.mark.asyncio
    async def test_nested_keys(self, store: BlobStore, prefix: str) -> None:
        key = prefix + "a/b/c/d.dstl"
        await store.put(key, b"deep")
        assert await store.get(key) == b"deep"
        # a key prefix is not an object, nor is a key "below" an object
        for not_an_object in (prefix + "a/b/c", prefix + "a/b/c/d.dstl/e"):
            with pytest.raises(BlobNotFound):
                await store.get(not_an_object)
        n = await store.delete([prefix + "a/b/c", prefix + "a/b/c/d.dstl/e"])
        assert n in ((0,) if self.delete_counts_existing else (0, 2))
        assert await store.get(key) == b"deep"

    @pytest.mark.asyncio
    async def test_overwrite_replaces(self, store: BlobStore, prefix: str) -> None:
        key = prefix + "k"
        await store.put(key, b"first version, longer")
        await store.put(key, b"second")
        assert await store.get(key) == b"second"
        assert [(i.key, i.size) for i in await _listed(store, prefix)] == [(key, 6)]

    @pytest.mark.asyncio
    async def test_overwrite_is_atomic_for_readers(self, store: BlobStore, prefix: str) -> None:
        """Concurrent readers see one whole version, never a mix or a prefix."""
        key = prefix + "k"
        v1 = b"A" * (256 * 1024)
        v2 = b"B" * (256 * 1024 + 17)
        await store.put(key, v1)
        seen: list[bytes] = []

        async def read_many() -> None:
            for _ in range(20):
                seen.append(await store.get(key))

        async def write_many() -> None:
            for i in range(10):
                await store.put(key, v2 if i % 2 == 0 else v1)

        await asyncio.gather(read_many(), read_many(), write_many())
        assert len(seen) == 40
        assert all(s in (v1, v2) for s in seen)
        assert await store.get(key) == v1

    # --------------------------------------------------------------- delete
    @pytest.mark.asyncio
    async def test_delete(self, store: BlobStore, prefix: str) -> None:
        keys = [prefix + n for n in ("a", "b", "c")]
        for k in keys:
            await store.put(k, b"data")
        n = await store.delete([*keys[:2], prefix + "never-written"])
        if self.delete_counts_existing:
            assert n == 2
        else:
            assert n in (2, 3)
        for k in keys[:2]:
            with pytest.raises(BlobNotFound):
                await store.get(k)
        assert await store.get(keys[2]) == b"data"
        assert [i.key for i in await _listed(store, prefix)] == [keys[2]]

    @pytest.mark.asyncio
    async def test_delete_missing_is_not_an_error(self, store: BlobStore, prefix: str) -> None:
        n = await store.delete([prefix + "nothing", prefix + "here/either"])
        if self.delete_counts_existing:
            assert n == 0
        else:
            assert n in (0, 2)
        assert await store.delete([]) == 0

    @pytest.mark.asyncio
    async def test_delete_twice(self, store: BlobStore, prefix: str) -> None:
        await store.put(prefix + "k", b"v")
        assert await store.delete([prefix + "k"]) == 1
        second = await store.delete([prefix + "k"])
        assert second in ((0,) if self.delete_counts_existing else (0, 1))

    # ----------------------------------------------------------------- list
    @pytest.mark.asyncio
    async def test_list_by_prefix(self, store: BlobStore, prefix: str) -> None:
        sizes = {"c": 3, "a": 1, "b/x": 5, "b/y": 2, "ab": 4, "b2": 7}
        for name, size in sizes.items():
            await store.put(prefix + name, b"z" * size)
        listed = await _listed(store, prefix)
        assert [(i.key, i.size) for i in listed] == [(prefix + n, sizes[n]) for n in sorted(sizes)]
        # keys come in key order
        assert [i.key for i in listed] == sorted(i.key for i in listed)

    @pytest.mark.asyncio
    async def test_list_nested_and_partial_prefixes(self, store: BlobStore, prefix: str) -> None:
        for name in ("job/00/k1", "job/00/k2", "job/01/k3", "job2/00/k4", "jo"):
            await store.put(prefix + name, name.encode())
        keys = [i.key for i in await _listed(store, prefix + "job/")]
        assert keys == [prefix + "job/00/k1", prefix + "job/00/k2", prefix + "job/01/k3"]
        keys = [i.key for i in await _listed(store, prefix + "job/00/")]
        assert keys == [prefix + "job/00/k1", prefix + "job/00/k2"]
        # a prefix is a string prefix, not a directory: "job" matches "job2/..." too
        keys = [i.key for i in await _listed(store, prefix + "job")]
        assert keys == [
            prefix + "job/00/k1",
            prefix + "job/00/k2",
            prefix + "job/01/k3",
            prefix + "job2/00/k4",
        ]
        keys = [i.key for i in await _listed(store, prefix + "job/00/k")]
        assert keys == [prefix + "job/00/k1", prefix + "job/00/k2"]
        keys = [i.key for i in await _listed(store, prefix + "job/01/k3")]
        assert keys == [prefix + "job/01/k3"]

    @pytest.mark.asyncio
    async def test_list_unknown_prefix_is_empty(self, store: BlobStore, prefix: str) -> None:
        await store.put(prefix + "present", b"1")
        assert await _listed(store, prefix + "absent/") == []
        assert await _listed(store, prefix + "absent") == []
        assert await _listed(store, prefix + "presentX") == []

    @pytest.mark.asyncio
    async def test_list_does_not_cross_prefixes(self, store: BlobStore, prefix: str) -> None:
        other = f"contract-{uuid.uuid4().hex[:16]}/"
        await store.put(prefix + "mine", b"1")
        await store.put(other + "theirs", b"2")
        try:
            assert [i.key for i in await _listed(store, prefix)] == [prefix + "mine"]
            assert [i.key for i in await _listed(store, other)] == [other + "theirs"]
        finally:
            await store.delete([other + "theirs"])

    @pytest.mark.asyncio
    async def test_list_reports_modification_time(self, store: BlobStore, prefix: str) -> None:
        """``modified`` is unix seconds of the write (S3 rounds it down to the second)."""
        before = time.time()
        await store.put(prefix + "a", b"first")
        await asyncio.sleep(1.1)  # later by more than the coarsest resolution (1 s)
        await store.put(prefix + "b", b"second")
        after = time.time()
        a, b = await _listed(store, prefix)
        assert isinstance(a.modified, float) and isinstance(b.modified, float)
        for info in (a, b):
            # within the test's window, with 2 s for resolution and clock slack
            assert before - 2 <= info.modified <= after + 2, (info, before, after)
        assert b.modified > a.modified
        # an overwrite is a new write
        await store.put(prefix + "a", b"rewritten")
        a2, b2 = await _listed(store, prefix)
        assert a2.modified >= b2.modified == b.modified

    @pytest.mark.asyncio
    async def test_list_start_after(self, store: BlobStore, prefix: str) -> None:
        names = ["a", "ab", "b/x", "b/y", "b2", "c", "job/00/k1", "job/00/k2", "job/01/k3", "jo"]
        for i, name in enumerate(names):
            await store.put(prefix + name, b"v" * (i + 1))
        everything = await _listed(store, prefix)
        assert [i.key for i in everything] == sorted(prefix + n for n in names)
        # every key, strings between keys, before and after them all
        # Not "b", "job" or "job/01": a start_after naming a "directory" (a key
        # prefix ending right before a '/') makes SeaweedFS skip its keys, unlike
        # AWS S3. Callers page with keys they listed, which are never one.
        between = "0 a0 b/ b/x0 b/z b1 d job/ job/00/ job/00/k job/00/k2/ job/02 jo/ z ~"
        candidates = [
            prefix,
            *(prefix + s for s in between.split()),
            *(i.key for i in everything),
        ]
        for start_after in candidates:
            got = [i async for i in store.list(prefix, start_after=start_after)]
            expected = [i for i in everything if i.key > start_after]
            assert [(i.key, i.size) for i in got] == [(i.key, i.size) for i in expected], (
                start_after
            )
        # start_after below the prefix changes nothing; with a narrower prefix too
        assert [i.key async for i in store.list(prefix + "b/", start_after="")] == [
            prefix + "b/x",
            prefix + "b/y",
        ]
        assert [i.key async for i in store.list(prefix + "b/", start_after=prefix + "b/x")] == [
            prefix + "b/y"
        ]
        assert [i.key async for i in store.list(prefix + "job/", start_after=prefix)] == [
            prefix + n for n in ("job/00/k1", "job/00/k2", "job/01/k3")
        ]
        assert [i async for i in store.list(prefix + "b/", start_after=prefix + "c")] == []

    @pytest.mark.asyncio
    async def test_list_pages_with_start_after(self, store: BlobStore, prefix: str) -> None:
        """Paging by the last key seen lists every object once, also while deleting."""
        keys = sorted(f"{prefix}{i % 5:02x}/obj-{i:03d}" for i in range(23))
        await asyncio.gather(*(store.put(k, b"p") for k in keys))
        seen: list[str] = []
        last = ""
        while True:
            page = []
            listing = store.list(prefix, start_after=last)
            # callers that stop early close the listing (the service does): it is a generator
            assert isinstance(listing, AsyncGenerator)
            async with contextlib.aclosing(listing):
                async for info in listing:
                    page.append(info.key)
                    if len(page) == 4:
                        break
            if not page:
                break
            seen += page
            last = page[-1]
            # deleting what was listed does not disturb the next page
            await store.delete(page[:2])
        assert seen == keys
        assert [i.key for i in await _listed(store, prefix)] == [
            k for i in range(0, len(keys), 4) for k in keys[i + 2 : i + 4]
        ]

    # ---------------------------------------------------------------- keys
    @pytest.mark.parametrize(
        "bad",
        ["", "/abs", "a//b", "a/./b", "a/../b", "..", "trailing/", "back\\slash", "nul\x00"],
    )
    @pytest.mark.asyncio
    async def test_invalid_keys_rejected(self, store: BlobStore, prefix: str, bad: str) -> None:
        key = bad if bad in ("", "/abs", "..") else prefix + bad
        with pytest.raises(InvalidArgument):
            await store.put(key, b"x")
        with pytest.raises(InvalidArgument):
            await store.get(key)
        with pytest.raises(InvalidArgument):
            await store.delete([key])

    # --------------------------------------------------------- housekeeping
    @pytest.mark.asyncio
    async def test_probe_answers_and_leaves_no_object(self, store: BlobStore, prefix: str) -> None:
        await store.put(prefix + "k", b"v")
        before = await _listed(store, "")
        await store.probe()
        await asyncio.gather(*(store.probe() for _ in range(4)))
        # whatever a probe writes (if anything) is never listed as an object
        assert await _listed(store, "") == before
        assert await store.get(prefix + "k") == b"v"

    @pytest.mark.asyncio
    async def test_sweep_leftovers_never_touches_objects(
        self, store: BlobStore, prefix: str
    ) -> None:
        keys = [prefix + "a", prefix + "b/c", prefix + "b/d.tmp"]
        for k in keys:
            await store.put(k, b"kept " + k.encode())
        # age 0: every leftover of an earlier process, and still no object
        assert await store.sweep_leftovers(0.0) == 0
        assert await store.sweep_leftovers(3600.0) == 0
        assert [i.key for i in await _listed(store, prefix)] == sorted(keys)
        for k in keys:
            assert await store.get(k) == b"kept " + k.encode()

    @pytest.mark.asyncio
    async def test_sweep_leftovers_during_puts(self, store: BlobStore, prefix: str) -> None:
        """A sweep with an age bound never breaks a write in progress."""
        payloads = {f"{prefix}{i % 3}/obj-{i:02d}": os.urandom(50_000 + i) for i in range(24)}

        async def sweep_many() -> None:
            for _ in range(10):
                assert await store.sweep_leftovers(60.0) == 0
                await asyncio.sleep(0)

        await asyncio.gather(sweep_many(), *(store.put(k, v) for k, v in payloads.items()))
        assert [i.key for i in await _listed(store, prefix)] == sorted(payloads)

    # ---------------------------------------------------------- concurrency
    @pytest.mark.asyncio
    async def test_concurrent_puts(self, store: BlobStore, prefix: str) -> None:
        payloads = {f"{prefix}{i % 4:02x}/obj-{i:03d}": os.urandom(100 + i * 37) for i in range(64)}
        await asyncio.gather(*(store.put(k, v) for k, v in payloads.items()))
        listed = await _listed(store, prefix)
        assert [(i.key, i.size) for i in listed] == sorted((k, len(v)) for k, v in payloads.items())
        got = await asyncio.gather(*(store.get(k) for k in payloads))
        assert got == list(payloads.values())
        assert await store.delete(list(payloads)) == 64
        assert await _listed(store, prefix) == []
