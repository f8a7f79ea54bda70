"""What the state classes call on a backend: the :class:`KeyedBackend` protocol.

The keyed state of :mod:`dstl_client.state.api` and the processor's states,
timers and TTL index (:mod:`dstl_client.processor`) take a ``KeyedBackend``
and call only what it names. Two backends implement it, checked by mypy:

* :class:`~dstl_client.state.backend.KeyedStateBackend` (and its changelog
  subclass): the rows of one key-group range in a local store, any key of
  the range current in turn;
* :class:`~dstl_client.bounded.backend.SingleKeyBackend` (sorted mode): the
  rows of the current key only, in memory, one pseudo key group.

Row keys (``k``) are the encoded row keys of :mod:`dstl_client.state.changes`
(state name, key, map tag); values are bytes. Reads and writes are scoped to
the current key's key group, except :meth:`KeyedBackend.scan_range`, which
names its key group (indexes kept per key group). A backend is used by one
task's thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from dstl_client.keygroups import KeyGroupRange

__all__ = ["KeyedBackend"]


class KeyedBackend(Protocol):
    """The calls a keyed state makes on its backend (see the module). One task's thread."""

    @property
    def kg_range(self) -> KeyGroupRange:
        """The key groups whose rows this backend holds."""
        ...

    @property
    def current_key(self) -> object:
        """The key every state access is scoped to (``None`` before the first)."""
        ...

    @property
    def current_key_bytes(self) -> bytes:
        """The current key's bytes (its row keys' key part)."""
        ...

    def set_current_key(self, key: object) -> None:
        """Scope every following state access to ``key``."""
        ...

    def set_current_key_group(self, kg: int) -> None:
        """Scope the following row writes to key group ``kg`` (replays, per-group indexes)."""
        ...

    def get(self, k: bytes) -> bytes | None:
        """The value of row ``k`` of the current key's key group, ``None`` when absent."""
        ...

    def put(self, k: bytes, v: bytes) -> None:
        """Set row ``k``."""
        ...

    def delete(self, k: bytes) -> None:
        """Remove row ``k`` (absent: nothing)."""
        ...

    def list_append(self, k: bytes, elements: bytes) -> None:
        """Append length-prefixed ``elements`` to the list at row ``k``."""
        ...

    def map_put(self, prefix: bytes, k: bytes, v: bytes) -> None:
        """Set entry row ``k`` of the map at ``prefix``."""
        ...

    def map_delete(self, prefix: bytes, k: bytes) -> None:
        """Remove entry row ``k`` of the map at ``prefix``."""
        ...

    def map_members(self, prefix: bytes) -> set[bytes]:
        """The entry row keys of the map at ``prefix``: a live set, it follows later writes."""
        ...

    def iter_map(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """``(entry row key, value)`` of the map at ``prefix``."""
        ...

    def delete_prefix(self, prefix: bytes) -> None:
        """Remove every row starting with ``prefix`` (a whole map)."""
        ...

    def scan_range(self, kg: int, start: bytes, end: bytes | None) -> list[tuple[bytes, bytes]]:
        """``(row key, value)`` of key group ``kg`` with ``start <= k < end``, in key order."""
        ...
