"""Time to live of state values (Spark's semantics), kept in the keyed state.

A state variable with ``ttlDurationMs`` stores each value (list element, map
entry) with its expiry in front (:func:`~.layout.stamp`): the processing time
of the batch that wrote it plus the TTL. A value whose expiry is at or before
the batch's processing time is invisible to every read. Each write also puts
an entry ``(expiry, name, key[, map key])`` into the key group's
``$ttl-index`` (sorted by expiry); each batch's cleanup pass scans the
index up to the batch's processing time and removes the values that really
expired (a value updated since has a later expiry and stays; its index entry
of the later expiry remains). Both go through the backend: logged,
checkpointed, restored and rescaled with the key group.

Invariants: every stored value with a TTL has an index entry at its expiry
(written in the same batch as the value); the cleanup removes an index entry
only once it is due. Thread: the task's thread only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dstl_client.processor.layout import (
    TTL_INDEX_PREFIX,
    decode_ttl_entry,
    encode_ttl_entry,
    index_bound,
)
from dstl_client.state.keyed_backend import KeyedBackend


@dataclass(frozen=True, slots=True)
class DueEntry:
    """One due ``$ttl-index`` entry: which value of which key may have expired. Immutable."""

    kg: int
    expiry_ms: int
    name: bytes
    key: bytes
    user_key: bytes
    #: the index row itself (to delete it)
    row: bytes


class TtlIndex:
    """The ``$ttl-index`` of the task's key groups.

    Invariant: one entry per (expiry, variable, key, map key). Thread: the task's.
    """

    __slots__ = ("_backend",)

    def __init__(self, backend: KeyedBackend) -> None:
        self._backend = backend

    def _row(self, expiry_ms: int, name: bytes, user_key: bytes) -> bytes:
        key = self._backend.current_key_bytes
        return TTL_INDEX_PREFIX + encode_ttl_entry(expiry_ms, name, key, user_key)

    def track(self, expiry_ms: int, name: bytes, user_key: bytes = b"") -> None:
        """A value of the current key expires at ``expiry_ms`` (written once per expiry)."""
        row = self._row(expiry_ms, name, user_key)
        if self._backend.get(row) is None:
            self._backend.map_put(TTL_INDEX_PREFIX, row, b"")

    def untrack(self, expiry_ms: int, name: bytes, user_key: bytes = b"") -> None:
        """Forget an entry whose value was replaced or removed (when its expiry is known)."""
        row = self._row(expiry_ms, name, user_key)
        if self._backend.get(row) is not None:
            self._backend.map_delete(TTL_INDEX_PREFIX, row)

    def due(self, now_ms: int) -> list[DueEntry]:
        """Entries at or before ``now_ms`` in the task's key groups, by key group then expiry."""
        backend = self._backend
        end = index_bound(TTL_INDEX_PREFIX, now_ms)
        n = len(TTL_INDEX_PREFIX)
        out: list[DueEntry] = []
        for kg in backend.kg_range:
            for row, _ in backend.scan_range(kg, TTL_INDEX_PREFIX, end):
                expiry, name, key, user_key = decode_ttl_entry(row[n:])
                out.append(DueEntry(kg, expiry, name, key, user_key, row))
        return out

    def remove(self, entry: DueEntry) -> None:
        """Delete a due entry (the backend's current key group must be ``entry.kg``)."""
        self._backend.map_delete(TTL_INDEX_PREFIX, entry.row)
