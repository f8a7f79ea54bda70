"""Spark's state variables (``ValueState``, ``ListState``, ``MapState``) on the keyed backend.

Same methods and meaning as ``pyspark.sql.streaming.stateful_processor``;
values are tuples of the variable's schema, encoded by a
:class:`~.codec.RowCodec`. Rows are laid out as the keyed state API's
(:mod:`dstl_client.state.changes`): a value or list is one row per key, a
map entry one row, so appends and entry updates log only what changed.
With a TTL, values carry their expiry and are indexed (:mod:`.ttl`).

Values come back as Spark's clients return them: tuples (``get``, list
elements, map keys, ``iterator``, ``values``), a ``Row`` from
``MapState.getValue``, nested structs as ``Row``\\ s (:mod:`.codec`).

Every access is scoped to the current key of the task (set by the runtime
before each ``handle*`` call); outside one (in ``init``) it raises
:class:`~dstl_client.core.errors.InvalidArgument`, and so does every use of
a variable removed by ``deleteIfExists`` (as in Spark). Thread: the task's
thread only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from dstl_client.core.errors import InvalidArgument
from dstl_client.processor.codec import RowCodec
from dstl_client.processor.layout import stamp, unstamp
from dstl_client.processor.ttl import TtlIndex
from dstl_client.state.changes import encode_element, iter_elements, map_prefix, state_prefix
from dstl_client.state.keyed_backend import KeyedBackend


class StateScope(Protocol):
    """What a state variable needs of the task's runtime."""

    @property
    def backend(self) -> KeyedBackend: ...

    @property
    def ttl_index(self) -> TtlIndex: ...

    @property
    def now_ms(self) -> int: ...

    def require_key(self) -> None: ...


class _Variable:
    """One named state variable of a task (the task's thread only)."""

    __slots__ = ("_codec", "_name", "_scope", "deleted", "name", "ttl_ms")

    kind = "state"

    def __init__(self, scope: StateScope, name: str, codec: RowCodec, ttl_ms: int | None) -> None:
        self._scope = scope
        self.name = name
        self._name = name.encode("utf-8")
        self._codec = codec
        self.ttl_ms = ttl_ms
        #: removed by ``deleteIfExists``: every use raises (as Spark's removed column family)
        self.deleted = False

    def _check_live(self) -> None:
        if self.deleted:
            raise InvalidArgument(
                f"{self.kind} {self.name!r} was deleted (deleteIfExists): it cannot be used"
            )

    def _expiry(self) -> int:
        assert self.ttl_ms is not None
        return self._scope.now_ms + self.ttl_ms

    def _live(self, raw: bytes | None) -> bytes | None:
        """The value of a stored row, ``None`` if absent or expired."""
        if raw is None or self.ttl_ms is None:
            return raw
        expiry, data = unstamp(raw)
        return data if expiry > self._scope.now_ms else None

    def _encode(self, value: Any) -> bytes:
        if value is None:
            raise InvalidArgument(f"{self.kind} {self.name!r}: a value cannot be None (use clear)")
        return self._codec.dumps(value)

    def evict(self, user_key: bytes, now_ms: int) -> int:
        """Remove what expired at ``now_ms`` for the current key; how many values."""
        raise NotImplementedError


class ValueState(_Variable):
    """One value per key (``exists``, ``get``, ``update``, ``clear``); one row per key.

    Invariant: with a TTL the row's expiry is indexed. Thread: the task's.
    """

    __slots__ = ()
    kind = "value state"

    def _row(self) -> bytes:
        self._check_live()
        self._scope.require_key()
        return state_prefix(self._name, self._scope.backend.current_key_bytes)

    def exists(self) -> bool:
        return self._live(self._scope.backend.get(self._row())) is not None

    def get(self) -> tuple[Any, ...] | None:
        """The value (a tuple), or ``None``."""
        data = self._live(self._scope.backend.get(self._row()))
        return None if data is None else self._codec.loads(data)

    def update(self, newValue: Any) -> None:
        row = self._row()
        data = self._encode(newValue)
        backend = self._scope.backend
        if self.ttl_ms is None:
            backend.put(row, data)
            return
        expiry = self._expiry()
        old = backend.get(row)
        old_expiry = None if old is None else unstamp(old)[0]
        backend.put(row, stamp(expiry, data))
        if old_expiry != expiry:
            if old_expiry is not None:
                self._scope.ttl_index.untrack(old_expiry, self._name)
            self._scope.ttl_index.track(expiry, self._name)

    def clear(self) -> None:
        row = self._row()
        backend = self._scope.backend
        if self.ttl_ms is not None:
            old = backend.get(row)
            if old is not None:
                self._scope.ttl_index.untrack(unstamp(old)[0], self._name)
        backend.delete(row)

    def evict(self, user_key: bytes, now_ms: int) -> int:
        row = self._row()
        backend = self._scope.backend
        raw = backend.get(row)
        if raw is None or unstamp(raw)[0] > now_ms:
            return 0
        backend.delete(row)
        return 1


class ListState(_Variable):
    """A list per key (``exists``, ``get``, ``put``, ``appendValue``, ``appendList``, ``clear``).

    With a TTL every element has its own expiry (the batch that appended it).
    One row per key; an append logs only the new elements. Thread: the task's.
    """

    __slots__ = ()
    kind = "list state"

    def _row(self) -> bytes:
        self._check_live()
        self._scope.require_key()
        return state_prefix(self._name, self._scope.backend.current_key_bytes)

    def _elements(self) -> list[bytes]:
        raw = self._scope.backend.get(self._row())
        if not raw:
            return []
        if self.ttl_ms is None:
            return list(iter_elements(raw))
        now = self._scope.now_ms
        out = []
        for element in iter_elements(raw):
            expiry, data = unstamp(element)
            if expiry > now:
                out.append(data)
        return out

    def exists(self) -> bool:
        return bool(self._elements())

    def get(self) -> Iterator[tuple[Any, ...]]:
        """The elements (tuples), oldest first."""
        loads = self._codec.loads
        return iter([loads(e) for e in self._elements()])

    def _pack(self, values: Iterable[Any]) -> bytes:
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise InvalidArgument(f"list state {self.name!r}: expected a list of values")
        encoded = [self._encode(v) for v in values]
        if self.ttl_ms is not None:
            expiry = self._expiry()
            encoded = [stamp(expiry, e) for e in encoded]
        return b"".join(encode_element(e) for e in encoded)

    def _tracked(self) -> None:
        if self.ttl_ms is not None:
            self._scope.ttl_index.track(self._expiry(), self._name)

    def put(self, newState: Iterable[Any]) -> None:
        """Replace the list (an empty one clears it)."""
        row = self._row()
        data = self._pack(newState)
        if not data:
            self._scope.backend.delete(row)
            return
        self._scope.backend.put(row, data)
        self._tracked()

    def appendValue(self, newState: Any) -> None:
        row = self._row()
        self._scope.backend.list_append(row, self._pack([newState]))
        self._tracked()

    def appendList(self, newState: Iterable[Any]) -> None:
        row = self._row()
        data = self._pack(newState)
        if data:
            self._scope.backend.list_append(row, data)
            self._tracked()

    def clear(self) -> None:
        self._scope.backend.delete(self._row())

    def evict(self, user_key: bytes, now_ms: int) -> int:
        row = self._row()
        backend = self._scope.backend
        raw = backend.get(row)
        if not raw:
            return 0
        kept = []
        dropped = 0
        for element in iter_elements(raw):
            if unstamp(element)[0] > now_ms:
                kept.append(element)
            else:
                dropped += 1
        if dropped:
            if kept:
                backend.put(row, b"".join(encode_element(e) for e in kept))
            else:
                backend.delete(row)
        return dropped


class MapState(_Variable):
    """A map per key (``exists``, ``getValue``, ``containsKey``, ``updateValue``,
    ``iterator``, ``keys``, ``values``, ``removeKey``, ``clear``); one row per entry.

    Entries are ordered by their key's encoded bytes. Thread: the task's.
    """

    __slots__ = ("_key_codec",)
    kind = "map state"

    def __init__(
        self,
        scope: StateScope,
        name: str,
        key_codec: RowCodec,
        value_codec: RowCodec,
        ttl_ms: int | None,
    ) -> None:
        super().__init__(scope, name, value_codec, ttl_ms)
        self._key_codec = key_codec

    def _prefix(self) -> bytes:
        self._check_live()
        self._scope.require_key()
        return map_prefix(self._name, self._scope.backend.current_key_bytes)

    def _user_key(self, key: Any) -> bytes:
        if key is None:
            raise InvalidArgument(f"map state {self.name!r}: a key cannot be None")
        return self._key_codec.dumps(key)

    def _entries(self) -> Iterator[tuple[bytes, bytes]]:
        prefix = self._prefix()
        n = len(prefix)
        for k, raw in self._scope.backend.iter_map(prefix):
            data = self._live(raw)
            if data is not None:
                yield k[n:], data

    def exists(self) -> bool:
        return next(self._entries(), None) is not None

    def getValue(self, key: Any) -> Any:
        """The value of ``key`` as a ``Row`` (as Spark's client returns it), or ``None``."""
        data = self._live(self._scope.backend.get(self._prefix() + self._user_key(key)))
        return None if data is None else self._codec.loads_row(data)

    def containsKey(self, key: Any) -> bool:
        return self._live(self._scope.backend.get(self._prefix() + self._user_key(key))) is not None

    def updateValue(self, key: Any, value: Any) -> None:
        prefix = self._prefix()
        user_key = self._user_key(key)
        data = self._encode(value)
        backend = self._scope.backend
        if self.ttl_ms is None:
            backend.map_put(prefix, prefix + user_key, data)
            return
        expiry = self._expiry()
        old = backend.get(prefix + user_key)
        old_expiry = None if old is None else unstamp(old)[0]
        backend.map_put(prefix, prefix + user_key, stamp(expiry, data))
        if old_expiry != expiry:
            if old_expiry is not None:
                self._scope.ttl_index.untrack(old_expiry, self._name, user_key)
            self._scope.ttl_index.track(expiry, self._name, user_key)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """``(key, value)`` tuples of the live entries, in the order of the keys' bytes."""
        kl, vl = self._key_codec.loads, self._codec.loads
        return iter([(kl(k), vl(v)) for k, v in self._entries()])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        kl = self._key_codec.loads
        return iter([kl(k) for k, _ in self._entries()])

    def values(self) -> Iterator[tuple[Any, ...]]:
        vl = self._codec.loads
        return iter([vl(v) for _, v in self._entries()])

    def removeKey(self, key: Any) -> None:
        prefix = self._prefix()
        user_key = self._user_key(key)
        backend = self._scope.backend
        if self.ttl_ms is not None:
            old = backend.get(prefix + user_key)
            if old is not None:
                self._scope.ttl_index.untrack(unstamp(old)[0], self._name, user_key)
        backend.map_delete(prefix, prefix + user_key)

    def clear(self) -> None:
        self._scope.backend.delete_prefix(self._prefix())

    def evict(self, user_key: bytes, now_ms: int) -> int:
        prefix = self._prefix()
        backend = self._scope.backend
        raw = backend.get(prefix + user_key)
        if raw is None or unstamp(raw)[0] > now_ms:
            return 0
        backend.map_delete(prefix, prefix + user_key)
        return 1


StateVariable = ValueState | ListState | MapState
