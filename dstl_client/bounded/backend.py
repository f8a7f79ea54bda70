"""The single-key state backend of sorted mode (Flink's FLIP-140 ``BatchExecutionKeyedStateBackend``).

When the input is bounded and sorted by key, a keyed operator sees every
row of a key in one run and never comes back to the key. Its state then
needs no random access, no store on disk, no changelog and no checkpoint:
:class:`SingleKeyBackend` holds the rows of the *current key only*, in a
dict, and drops them when the runner moves on to the next key.

It has the methods the state classes call on
:class:`~dstl_client.state.backend.KeyedStateBackend` (``get``, ``put``,
``delete``, ``map_put``, ``map_delete``, ``map_members``, ``iter_map``,
``delete_prefix``, ``list_append``, ``scan_range``, the current key), so the
same classes run on it unchanged: the ``KeyedContext`` states of
:mod:`dstl_client.state.api` and the processor's states, timers and TTL index
of :mod:`dstl_client.processor`, which take a
:class:`~dstl_client.state.keyed_backend.KeyedBackend` (mypy checks that
this class implements it).

Invariants: only the runner changes the key (:meth:`SingleKeyBackend.start_key`),
keys arrive in strictly increasing order (the sort guarantees it; a key seen
again, or out of order, raises :class:`KeyOrderError`), and user code cannot
switch the current key (:meth:`SingleKeyBackend.set_current_key` accepts the
current key only). Key groups mean nothing here: the backend has one
pseudo key group, ``0``, so the per-key-group indexes (timers, TTL) are
plain maps of the current key's rows. Thread: one task's thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dstl_client.core.errors import InvalidArgument
from dstl_client.keygroups import KeyGroupRange, key_bytes
from dstl_client.state.keyed_backend import KeyedBackend

#: the one pseudo key group of a single-key backend
PSEUDO_KEY_GROUP = 0
_RANGE = KeyGroupRange(PSEUDO_KEY_GROUP, PSEUDO_KEY_GROUP)


class KeyOrderError(InvalidArgument):
    """Sorted mode met a key out of order, a key again, or user code switching the key."""


def check_key_order(previous: Any, key: Any) -> None:
    """Raise :class:`KeyOrderError` unless ``key`` comes strictly after ``previous``.

    The order is Python's, which for the key types of a Spark key column is
    the order of Spark's sort: integers by value, strings by code point
    (Spark compares their UTF-8 bytes, which order alike).
    """
    try:
        ahead = key > previous
    except TypeError:
        raise KeyOrderError(
            f"key {key!r} cannot be ordered after key {previous!r} "
            f"({type(key).__name__} vs {type(previous).__name__}): sorted mode needs "
            "keys of one type"
        ) from None
    if ahead:
        return
    if key == previous:
        raise KeyOrderError(
            f"key {key!r} arrived again after its run ended: sorted mode sees each key "
            "once (the input must be sorted by key)"
        )
    raise KeyOrderError(
        f"key {key!r} arrived after key {previous!r}: the input is not sorted by key (a key "
        "seen again after another one, or keys out of order; sorted mode needs each "
        "partition sorted, e.g. sortWithinPartitions(key))"
    )


class SingleKeyBackend:
    """State rows of the current key only, dropped at the next key (see the module).

    Invariants: ``_rows`` holds rows of ``current_key`` only; ``_maps[p]`` is
    the set of row keys in ``_rows`` that are entries of the map at prefix
    ``p``; keys start in strictly increasing order. Thread: one task's.
    """

    __slots__ = (
        "_check_order",
        "_has_key",
        "_last_key",
        "_maps",
        "_rows",
        "_started",
        "changes",
        "current_key",
        "current_key_bytes",
        "keys",
        "kg_range",
        "max_rows",
    )

    #: the pseudo key group every row belongs to
    current_kg = PSEUDO_KEY_GROUP

    def __init__(self, *, check_order: bool = True) -> None:
        """``check_order=False``: trust the caller's order (a benchmark's sorted keys)."""
        self._rows: dict[bytes, bytes] = {}
        self._maps: dict[bytes, set[bytes]] = {}
        self._check_order = check_order
        self._has_key = False
        self._started = False
        self._last_key: Any = None
        self.kg_range = _RANGE
        self.current_key: Any = None
        self.current_key_bytes = b""
        #: keys started so far
        self.keys = 0
        #: state writes so far (as the keyed backend counts them)
        self.changes = 0
        #: the most rows a key held when it ended (memory follows the largest key's state)
        self.max_rows = 0

    # ------------------------------------------------------------- the key
    def start_key(self, key: Any) -> None:
        """Make ``key`` current with empty state (the runner's call, once per key).

        Drops the previous key's state. Raises :class:`KeyOrderError` if
        ``key`` does not come strictly after the previous key.
        """
        if self._started and self._check_order:
            last = self._last_key
            try:
                ahead = key > last
            except TypeError:
                ahead = False
            if not ahead:
                check_key_order(last, key)  # raises, saying why
        kb = key.encode("utf-8") if type(key) is str else key_bytes(key)
        if self._rows:
            self.end_key()
        self.current_key = key
        self.current_key_bytes = kb
        self._has_key = True
        self._started = True
        self._last_key = key
        self.keys += 1

    def end_key(self) -> None:
        """Drop the current key's state; no key is current until the next :meth:`start_key`."""
        rows = self._rows
        if rows:
            if len(rows) > self.max_rows:
                self.max_rows = len(rows)
            rows.clear()
            self._maps.clear()
        self.current_key = None
        self.current_key_bytes = b""
        self._has_key = False

    def set_current_key(self, key: Any) -> None:
        """Accepted for the current key only: in sorted mode the runner owns the key."""
        if self._has_key and (key is self.current_key or key_bytes(key) == self.current_key_bytes):
            return
        raise KeyOrderError(
            f"set_current_key({key!r}) while the current key is {self.current_key!r}: in "
            "sorted mode the runner sets the key (one key at a time, in key order); user "
            "code cannot switch it"
        )

    def set_current_key_group(self, kg: int) -> None:
        """Key groups mean nothing here (one pseudo key group): only ``0`` is accepted."""
        if kg != PSEUDO_KEY_GROUP:
            raise InvalidArgument(f"key group {kg}: a single-key backend has one, 0")

    @property
    def held_rows(self) -> int:
        """Rows the current key holds now."""
        return len(self._rows)

    # ------------------------------------------------------------- reads
    def get(self, k: bytes) -> bytes | None:
        return self._rows.get(k)

    def map_members(self, prefix: bytes) -> set[bytes]:
        """Row keys of the map at ``prefix`` (a live set, as the keyed backend's)."""
        members = self._maps.get(prefix)
        if members is None:
            members = self._maps[prefix] = set()
        return members

    def iter_map(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """``(row key, value)`` of every entry of the map at ``prefix``, in key order."""
        members = self._maps.get(prefix)
        if not members:
            return
        rows = self._rows
        for k in sorted(members):
            v = rows.get(k)
            if v is not None:
                yield k, v

    def scan_range(self, kg: int, start: bytes, end: bytes | None) -> list[tuple[bytes, bytes]]:
        """``(row key, value)`` with ``start <= k < end`` (``None``: unbounded), in key order."""
        self.set_current_key_group(kg)
        if end is None:
            found = [(k, v) for k, v in self._rows.items() if k >= start]
        else:
            found = [(k, v) for k, v in self._rows.items() if start <= k < end]
        found.sort()
        return found

    # ------------------------------------------------------------- writes
    def put(self, k: bytes, v: bytes) -> None:
        self._rows[k] = v
        self.changes += 1

    def delete(self, k: bytes) -> None:
        self._rows.pop(k, None)
        self.changes += 1

    def map_put(self, prefix: bytes, k: bytes, v: bytes) -> None:
        self.map_members(prefix).add(k)
        self._rows[k] = v
        self.changes += 1

    def map_delete(self, prefix: bytes, k: bytes) -> None:
        members = self._maps.get(prefix)
        if members is not None:
            members.discard(k)
        self._rows.pop(k, None)
        self.changes += 1

    def delete_prefix(self, prefix: bytes) -> None:
        members = self._maps.get(prefix)
        if members:
            rows = self._rows
            for k in members:
                rows.pop(k, None)
            members.clear()
        self.changes += 1

    def list_append(self, k: bytes, elements: bytes) -> None:
        old = self._rows.get(k)
        self._rows[k] = elements if old is None else old + elements
        self.changes += 1

    # ----------------------------------------------- what the keyed backend has too
    def flush(self) -> None:
        """Nothing to write: the state of a key ends with the key."""

    def flush_log(self) -> None:
        """Nothing is logged in sorted mode."""


def as_keyed_backend(backend: SingleKeyBackend) -> KeyedBackend:
    """``backend`` as the :class:`~dstl_client.state.keyed_backend.KeyedBackend` the state
    classes take (no conversion: mypy checks here that the class implements it)."""
    return backend
