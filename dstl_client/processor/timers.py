"""Timers of one task's key groups, kept in the keyed state (see :mod:`.layout`).

A timer is two rows, both written through the backend (so logged to the
DSTL and restored and rescaled with their key group): ``$timers`` of the key
(``ms``), which answers ``listTimers`` and whether a timer exists, and the
key group's ``$timer-index`` (``ms key``), which is sorted by time so the
expired timers of a key group are one range scan, keys with no input in the
batch included, without reading the rest of the state.

Invariants: both rows exist or neither (register and delete write both);
registering an existing timer or deleting a missing one changes nothing and
logs nothing. Thread: the task's thread only (like its backend).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from dstl_client.processor.layout import (
    TIME_BYTES,
    TIMER_INDEX_PREFIX,
    TIMERS,
    decode_ms,
    encode_ms,
    index_bound,
)
from dstl_client.state.changes import map_prefix
from dstl_client.state.keyed_backend import KeyedBackend


class TimerService:
    """Register, delete and list the current key's timers; find the range's expired ones.

    Invariants: see the module (both rows or neither). Thread: the task's.
    """

    __slots__ = ("_backend",)

    def __init__(self, backend: KeyedBackend) -> None:
        self._backend = backend

    def _key_prefix(self) -> bytes:
        return map_prefix(TIMERS, self._backend.current_key_bytes)

    def exists(self, ms: int) -> bool:
        """Whether the current key has a timer at ``ms``."""
        return self._backend.get(self._key_prefix() + encode_ms(ms)) is not None

    def register(self, ms: int) -> bool:
        """A timer of the current key at ``ms``; ``False`` if it existed already."""
        prefix = self._key_prefix()
        at = encode_ms(ms)
        backend = self._backend
        if backend.get(prefix + at) is not None:
            return False
        backend.map_put(prefix, prefix + at, b"")
        backend.map_put(
            TIMER_INDEX_PREFIX, TIMER_INDEX_PREFIX + at + backend.current_key_bytes, b""
        )
        return True

    def delete(self, ms: int) -> bool:
        """Remove the current key's timer at ``ms``; ``False`` if there was none."""
        prefix = self._key_prefix()
        at = encode_ms(ms)
        backend = self._backend
        if backend.get(prefix + at) is None:
            return False
        backend.map_delete(prefix, prefix + at)
        backend.map_delete(TIMER_INDEX_PREFIX, TIMER_INDEX_PREFIX + at + backend.current_key_bytes)
        return True

    def listed(self) -> Iterator[int]:
        """The current key's timers, earliest first."""
        prefix = self._key_prefix()
        n = len(prefix)
        return iter([decode_ms(k, n) for k, _ in self._backend.iter_map(prefix)])

    def expired(self, up_to_ms: int) -> list[tuple[int, bytes]]:
        """``(ms, key bytes)`` of every timer at or before ``up_to_ms`` in the task's key
        groups, ordered by time, then key bytes."""
        backend = self._backend
        start = TIMER_INDEX_PREFIX
        end = index_bound(start, up_to_ms)
        n = len(start)
        per_kg: list[list[tuple[int, bytes]]] = []
        for kg in backend.kg_range:
            rows = backend.scan_range(kg, start, end)
            if rows:
                per_kg.append([(decode_ms(k, n), k[n + TIME_BYTES :]) for k, _ in rows])
        return list(heapq.merge(*per_kg))
