"""A bounded in-memory cache of the objects this sidecar wrote, in front of its store.

Restores mostly happen on the node that wrote the changelog (a task retried
on its executor, a query restarted on the same executors), and right after
the writes: a changelog tail of many checkpoints is then many small ranged
reads of objects this very sidecar uploaded minutes ago. Each such read costs
an S3 round trip and several milliseconds of the event loop's CPU in the S3
client; from memory it costs a slice.

:class:`CachedBlobStore` wraps the sidecar's store and keeps the body of
every object it put, up to a byte budget (least recently used out first).
Objects are write-once under keys never reused (every upload attempt gets a
new key), so a cached body can never be stale; the cache is only ever a
copy of what the store acknowledged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from dstl_client.core.errors import InvalidArgument
from dstl_server.storage.base import BlobInfo, BlobStore

if TYPE_CHECKING:
    from dstl_client.core.errors import StorageError
    from dstl_server.metrics import ServerMetrics


class CachedBlobStore(BlobStore):
    """The wrapped store, with the bodies of recent ``put``\\s served from memory.

    Invariants:

    * an object enters the cache only after the wrapped store's ``put``
      returned (a failed or cancelled put is never served), and only if it is
      at most ``max_object_bytes``;
    * the cached bytes never exceed ``capacity_bytes``: the least recently
      used objects (put or read) leave first; ``capacity_bytes = 0`` caches
      nothing;
    * ``delete`` drops the keys from the cache before deleting them in the
      store, so a read after this sidecar's delete reaches the store (and
      fails as it would without the cache). An object deleted through
      *another* process (another node's sidecar, the driver's orphan sweep)
      stays readable here until evicted: those deletes only remove objects no
      checkpoint references, and the bytes are what was uploaded;
    * ``get`` of a cached key returns exactly what the wrapped store would
      (the same range rules: past the end, fewer bytes); everything else
      (``list``, ``probe``, ``sweep_leftovers``, ``close``) is the wrapped
      store's. The reader verifies every section's CRC on cached bytes too.

    Which task may call: any task on the sidecar's event loop, like any store
    (the cache's bookkeeping has no ``await`` inside, so needs no lock).
    """

    def __init__(
        self,
        inner: BlobStore,
        capacity_bytes: int,
        *,
        max_object_bytes: int | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.inner = inner
        self.url = inner.url
        self.capacity_bytes = capacity_bytes
        self.max_object_bytes = (
            capacity_bytes if max_object_bytes is None else min(max_object_bytes, capacity_bytes)
        )
        self.metrics = metrics
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    @property
    def cached_bytes(self) -> int:
        """Bytes of object bodies held now (at most ``capacity_bytes``)."""
        return self._bytes

    def __contains__(self, key: object) -> bool:
        return key in self._objects

    # ------------------------------------------------------------ the cache
    def _keep(self, key: str, data: bytes) -> None:
        if len(data) > self.max_object_bytes:
            return
        self._drop(key)
        self._objects[key] = data
        self._bytes += len(data)
        while self._bytes > self.capacity_bytes:
            _, old = self._objects.popitem(last=False)
            self._bytes -= len(old)
        self._report()

    def _drop(self, key: str) -> None:
        old = self._objects.pop(key, None)
        if old is not None:
            self._bytes -= len(old)

    def _report(self) -> None:
        if self.metrics is not None:
            self.metrics.read_cache_bytes.set(self._bytes)

    # ------------------------------------------------------------ BlobStore
    async def put(self, key: str, data: bytes) -> None:
        await self.inner.put(key, data)
        # bytes are immutable: keeping them is no copy (anything else is copied once)
        self._keep(key, data if type(data) is bytes else bytes(data))

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        data = self._objects.get(key)
        if data is None:
            if self.metrics is not None:
                self.metrics.read_cache_misses.inc()
            return await self.inner.get(key, offset, length)
        # the key is valid: it was put (a bad key never gets here)
        if offset < 0 or (length is not None and length < 0):
            raise InvalidArgument(f"bad range offset={offset} length={length}")
        self._objects.move_to_end(key)
        if self.metrics is not None:
            self.metrics.read_cache_hits.inc()
        return data[offset:] if length is None else data[offset : offset + length]

    async def delete(self, keys: Sequence[str]) -> int:
        for key in keys:
            self._drop(key)
        self._report()
        return await self.inner.delete(keys)

    def list(self, prefix: str = "", start_after: str = "") -> AsyncIterator[BlobInfo]:
        return self.inner.list(prefix, start_after)

    async def probe(self) -> None:
        await self.inner.probe()

    def fatal_at_start(self, error: StorageError) -> bool:
        return self.inner.fatal_at_start(error)

    async def sweep_leftovers(self, older_than_s: float) -> int:
        return await self.inner.sweep_leftovers(older_than_s)

    async def close(self) -> None:
        self._objects.clear()
        self._bytes = 0
        self._report()
        await self.inner.close()
