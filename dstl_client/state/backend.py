"""The keyed state backends: local state with a write cache, and the changelog wrapper.

:class:`KeyedStateBackend` gives the state primitives (get, put, delete, map
scans, list appends) for the *current key* on top of a
:class:`~dstl_client.state.store.LocalKeyedStore`: reads go through a cache,
writes stay in the cache until :meth:`flush` writes them into the store's
pending batch (``delta``), or, for restores, straight into its main version.

:class:`ChangelogStateBackend` is the changelog backend of FLIP-158: every
change is applied locally *and* appended to the DSTL through a
:class:`~dstl_client.client.ChangelogWriter`, tagged with its key group.
"""

from __future__ import annotations

from collections.abc import Iterator

from dstl_client.checkpoint.messages import DEFAULT_CACHE_ROWS
from dstl_client.client import ChangelogWriter
from dstl_client.core.errors import DstlError, KeyGroupOutOfRange, WriterFailed
from dstl_client.keygroups import KeyGroupRange, key_bytes, key_group_of_bytes
from dstl_client.state.changes import (
    OP_DELETE,
    OP_DELETE_PREFIX,
    OP_LIST_APPEND,
    OP_PUT,
    decode_change,
    encode_delete,
    encode_delete_prefix,
    encode_list_append,
    encode_put,
    map_prefix_of,
)
from dstl_client.state.keyed_backend import KeyedBackend
from dstl_client.state.store import LocalKeyedStore

#: changes buffered before they are handed to the writer
_LOG_BATCH = 4096


class KeyedStateBackend:
    """State rows of one key-group range, scoped to the current key. One task, one thread."""

    def __init__(
        self,
        store: LocalKeyedStore,
        max_parallelism: int,
        *,
        target: str = "delta",
        cache_rows: int = DEFAULT_CACHE_ROWS,
    ) -> None:
        if target not in ("delta", "main"):
            raise ValueError(f"bad flush target {target!r}")
        self.store = store
        self.kg_range: KeyGroupRange = store.kg_range
        self.max_parallelism = max_parallelism
        self.target = target
        self.cache_rows = cache_rows
        self._cache: dict[tuple[int, bytes], bytes | None] = {}
        self._dirty: set[tuple[int, bytes]] = set()
        # members of the maps read or written in this task, by (kg, prefix)
        self._maps: dict[tuple[int, bytes], set[bytes]] = {}
        self._spilled = False
        self.current_key: object = None
        self.current_key_bytes = b""
        self.current_kg = -1
        #: key groups written in this task
        self.touched: set[int] = set()
        self.changes = 0

    # ------------------------------------------------------------- the key
    def set_current_key(self, key: object) -> None:
        """Scope every following state access to ``key``."""
        kb = key_bytes(key)
        kg = key_group_of_bytes(kb, self.max_parallelism)
        if kg not in self.kg_range:
            raise KeyGroupOutOfRange(
                f"key {key!r} is in key group {kg}, outside this subtask's range {self.kg_range} "
                "(rows were routed to the wrong partition)"
            )
        self.current_key = key
        self.current_key_bytes = kb
        self.current_kg = kg

    def set_current_key_group(self, kg: int) -> None:
        """For replays: changes name their key group, not their key."""
        self.current_kg = kg

    # ------------------------------------------------------------- reads
    @property
    def _with_delta(self) -> bool:
        # rows of this task spilled into the pending batch must be read back
        return self._spilled and self.target == "delta"

    def get(self, k: bytes) -> bytes | None:
        ck = (self.current_kg, k)
        try:
            return self._cache[ck]
        except KeyError:
            pass
        v = self.store.get(ck[0], k, self._with_delta)
        if len(self._cache) >= self.cache_rows:
            self._spill()
        self._cache[ck] = v
        return v

    def map_members(self, prefix: bytes) -> set[bytes]:
        """Row keys of the map at ``prefix`` for the current key (loaded on first use).

        Dirty rows are written to the store first, so one scan sees every entry.
        """
        mk = (self.current_kg, prefix)
        members = self._maps.get(mk)
        if members is not None:
            return members
        if self._dirty:
            self._write_dirty()
            self._spilled = True
        rows = self.store.scan_prefix(mk[0], prefix, self._with_delta)
        for k, v in rows.items():
            self._cache.setdefault((mk[0], k), v)
        members = set(rows)
        self._maps[mk] = members
        return members

    def scan_range(self, kg: int, start: bytes, end: bytes | None) -> list[tuple[bytes, bytes]]:
        """``(row key, value)`` of key group ``kg`` with ``start <= k < end``, in key order.

        ``end=None``: no upper bound. Any key group of the range (not only the
        current key's): for indexes kept per key group (timers, TTL). This
        task's writes are included (dirty rows are written to the store
        first, as for :meth:`map_members`); the rows read are cached.
        """
        if kg not in self.kg_range:
            raise KeyGroupOutOfRange(
                f"key group {kg} is outside this subtask's range {self.kg_range}"
            )
        if self._dirty:
            self._write_dirty()
            self._spilled = True
        rows = self.store.scan_range(kg, start, end, self._with_delta)
        if len(self._cache) + len(rows) <= self.cache_rows:
            for k, v in rows.items():
                self._cache.setdefault((kg, k), v)
        return sorted(rows.items())

    def iter_map(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """``(row key, value)`` of every entry of the map at ``prefix``, in key order."""
        for k in sorted(self.map_members(prefix)):
            v = self.get(k)
            if v is not None:
                yield k, v

    # ------------------------------------------------------------- writes
    def _set(self, k: bytes, v: bytes | None) -> None:
        ck = (self.current_kg, k)
        if len(self._cache) >= self.cache_rows and ck not in self._cache:
            self._spill()
        self._cache[ck] = v
        self._dirty.add(ck)
        self.touched.add(ck[0])
        self.changes += 1

    def put(self, k: bytes, v: bytes) -> None:
        self._set(k, v)

    def delete(self, k: bytes) -> None:
        self._set(k, None)

    def _map_write(self, prefix: bytes, k: bytes, present: bool) -> None:
        members = self._maps.get((self.current_kg, prefix))
        if members is not None:
            if present:
                members.add(k)
            else:
                members.discard(k)

    def map_put(self, prefix: bytes, k: bytes, v: bytes) -> None:
        self._map_write(prefix, k, True)
        self._set(k, v)

    def map_delete(self, prefix: bytes, k: bytes) -> None:
        self._map_write(prefix, k, False)
        self._set(k, None)

    def delete_prefix(self, prefix: bytes) -> None:
        members = self.map_members(prefix)
        for k in list(members):
            self._set(k, None)
        members.clear()
        self.touched.add(self.current_kg)

    def list_append(self, k: bytes, elements: bytes) -> None:
        old = self.get(k)
        self._set(k, elements if old is None else old + elements)

    # ------------------------------------------------------------ replays
    def apply_change(self, kg: int, change: bytes) -> None:
        """Apply one logged change of key group ``kg`` locally (a replay)."""
        op, k, value = decode_change(change)
        self.current_kg = kg
        if op in (OP_PUT, OP_DELETE):
            map_prefix = map_prefix_of(k)
            if map_prefix is None:
                self.put(k, value) if op == OP_PUT else self.delete(k)
            elif op == OP_PUT:
                self.map_put(map_prefix, k, value)
            else:
                self.map_delete(map_prefix, k)
        elif op == OP_DELETE_PREFIX:
            self.delete_prefix(k)
        elif op == OP_LIST_APPEND:
            self.list_append(k, value)

    # ------------------------------------------------------------- flushes
    def _spill(self) -> None:
        """Write dirty rows to the store and clear the cache (bounded memory)."""
        self._write_dirty()
        self._cache.clear()
        self._spilled = True

    def _write_dirty(self) -> None:
        if not self._dirty:
            return
        cache = self._cache
        rows = ((kg, k, cache[(kg, k)]) for kg, k in self._dirty)
        if self.target == "main":
            self.store.write_main(rows)
        else:
            self.store.write_delta(rows)
        self._dirty.clear()

    def flush(self) -> None:
        """Write every dirty row into the store (inside its open transaction)."""
        self._write_dirty()


class ChangelogStateBackend(KeyedStateBackend):
    """A :class:`KeyedStateBackend` that also appends every change to the DSTL."""

    def __init__(
        self,
        store: LocalKeyedStore,
        max_parallelism: int,
        writer: ChangelogWriter,
        *,
        cache_rows: int = DEFAULT_CACHE_ROWS,
    ) -> None:
        super().__init__(store, max_parallelism, target="delta", cache_rows=cache_rows)
        self.writer = writer
        self._log: list[tuple[int, bytes]] = []
        self.logged_bytes = 0
        self._hand_over_failed: DstlError | None = None

    def _append(self, change: bytes) -> None:
        self._log.append((self.current_kg, change))
        self.logged_bytes += len(change)
        if len(self._log) >= _LOG_BATCH:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give the buffered changes to the writer; a failure is final.

        The changes are applied locally already. If the writer did not take
        them all (bad input part-way, a failed send), this task's log can no
        longer match its state: every later hand-over raises
        :class:`~dstl_client.core.errors.WriterFailed`, even if the caller caught
        the first error, so the task fails and is retried from the last
        checkpoint.
        """
        if self._hand_over_failed is not None:
            raise WriterFailed(
                f"changes of this task could not all be logged ({self._hand_over_failed}); "
                "the task must be retried from the last checkpoint",
                cause=self._hand_over_failed,
            )
        try:
            self.writer.append_many(self._log)
        except BaseException as exc:
            self._hand_over_failed = (
                exc if isinstance(exc, DstlError) else DstlError(f"{type(exc).__name__}: {exc}")
            )
            raise
        self._log = []

    def put(self, k: bytes, v: bytes) -> None:
        super().put(k, v)
        self._append(encode_put(k, v))

    def delete(self, k: bytes) -> None:
        super().delete(k)
        self._append(encode_delete(k))

    def map_put(self, prefix: bytes, k: bytes, v: bytes) -> None:
        super().map_put(prefix, k, v)
        self._append(encode_put(k, v))

    def map_delete(self, prefix: bytes, k: bytes) -> None:
        super().map_delete(prefix, k)
        self._append(encode_delete(k))

    def delete_prefix(self, prefix: bytes) -> None:
        members = self.map_members(prefix)
        for k in list(members):
            KeyedStateBackend.delete(self, k)
        members.clear()
        self.touched.add(self.current_kg)
        self._append(encode_delete_prefix(prefix))

    def list_append(self, k: bytes, elements: bytes) -> None:
        super().list_append(k, elements)
        self._append(encode_list_append(k, elements))

    def flush_log(self) -> None:
        """Hand buffered changes to the writer (they are not durable yet)."""
        if self._log or self._hand_over_failed is not None:
            self._hand_over()


#: mypy checks that the keyed backend implements what the state classes call
_IMPLEMENTS: type[KeyedBackend] = KeyedStateBackend
