"""The keyed state API user functions see.

A function gets a :class:`KeyedContext` and asks it for states by name and
serializer; every state is scoped to the context's current key::

    def count_clicks(key, rows, ctx):
        total = ctx.value_state("total", INT64)
        seen = ctx.map_state("pages", STR, INT64)
        for row in rows:
            total.update((total.value() or 0) + 1)
            seen.put(row["page"], (seen.get(row["page"]) or 0) + 1)
        yield (key, total.value())

A name belongs to one kind of state for the job's lifetime (a value state and
a map state cannot share a name). ``ctx.operator_list_state(name, serializer,
mode)`` is the subtask's non-keyed list (:mod:`.operator_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from dstl_client.core.errors import InvalidArgument
from dstl_client.state.changes import encode_element, iter_elements, map_prefix, state_prefix
from dstl_client.state.keyed_backend import KeyedBackend
from dstl_client.state.operator_state import OperatorListState, OperatorStates
from dstl_client.state.serializers import Serializer

V = TypeVar("V")
K = TypeVar("K")


class _State:
    __slots__ = ("_backend", "_name")

    def __init__(self, backend: KeyedBackend, name: str) -> None:
        self._backend = backend
        self._name = name.encode("utf-8")

    def _prefix(self) -> bytes:
        return state_prefix(self._name, self._backend.current_key_bytes)


class ValueState(_State, Generic[V]):
    """One value per key."""

    __slots__ = ("_ser",)

    def __init__(self, backend: KeyedBackend, name: str, serializer: Serializer[V]) -> None:
        super().__init__(backend, name)
        self._ser = serializer

    def value(self) -> V | None:
        """The value, or ``None`` when unset."""
        data = self._backend.get(self._prefix())
        return None if data is None else self._ser.loads(data)

    def update(self, value: V) -> None:
        """Set the value (``None`` clears it)."""
        if value is None:
            self.clear()
        else:
            self._backend.put(self._prefix(), self._ser.dumps(value))

    def clear(self) -> None:
        self._backend.delete(self._prefix())


class ListState(_State, Generic[V]):
    """A list per key; appends log only the new elements."""

    __slots__ = ("_ser",)

    def __init__(self, backend: KeyedBackend, name: str, serializer: Serializer[V]) -> None:
        super().__init__(backend, name)
        self._ser = serializer

    def get(self) -> list[V]:
        """The elements (empty when unset)."""
        data = self._backend.get(self._prefix())
        if not data:
            return []
        return [self._ser.loads(e) for e in iter_elements(data)]

    def add(self, value: V) -> None:
        self._backend.list_append(self._prefix(), encode_element(self._ser.dumps(value)))

    def add_all(self, values: Iterable[V]) -> None:
        data = b"".join(encode_element(self._ser.dumps(v)) for v in values)
        if data:
            self._backend.list_append(self._prefix(), data)

    def update(self, values: Iterable[V]) -> None:
        """Replace the whole list (an empty list clears it)."""
        data = b"".join(encode_element(self._ser.dumps(v)) for v in values)
        if data:
            self._backend.put(self._prefix(), data)
        else:
            self.clear()

    def clear(self) -> None:
        self._backend.delete(self._prefix())


class MapState(_State, Generic[K, V]):
    """A map per key; each entry is its own row and its own logged change."""

    __slots__ = ("_kser", "_vser")

    def __init__(
        self,
        backend: KeyedBackend,
        name: str,
        key_serializer: Serializer[K],
        value_serializer: Serializer[V],
    ) -> None:
        super().__init__(backend, name)
        self._kser = key_serializer
        self._vser = value_serializer

    def _prefix(self) -> bytes:
        return map_prefix(self._name, self._backend.current_key_bytes)

    def get(self, key: K) -> V | None:
        data = self._backend.get(self._prefix() + self._kser.dumps(key))
        return None if data is None else self._vser.loads(data)

    def put(self, key: K, value: V) -> None:
        prefix = self._prefix()
        self._backend.map_put(prefix, prefix + self._kser.dumps(key), self._vser.dumps(value))

    def put_all(self, items: Iterable[tuple[K, V]] | dict[K, V]) -> None:
        pairs = items.items() if isinstance(items, dict) else items
        for k, v in pairs:
            self.put(k, v)

    def remove(self, key: K) -> None:
        prefix = self._prefix()
        self._backend.map_delete(prefix, prefix + self._kser.dumps(key))

    def contains(self, key: K) -> bool:
        return self._backend.get(self._prefix() + self._kser.dumps(key)) is not None

    def items(self) -> Iterator[tuple[K, V]]:
        """Entries in the order of their serialized keys."""
        prefix = self._prefix()
        n = len(prefix)
        for k, v in self._backend.iter_map(prefix):
            yield self._kser.loads(k[n:]), self._vser.loads(v)

    def keys(self) -> Iterator[K]:
        for k, _ in self.items():
            yield k

    def values(self) -> Iterator[V]:
        for _, v in self.items():
            yield v

    def is_empty(self) -> bool:
        return not self._backend.map_members(self._prefix())

    def clear(self) -> None:
        self._backend.delete_prefix(self._prefix())


class ReducingState(_State, Generic[V]):
    """One value per key, folded with ``reduce_fn(old, new)`` on every add."""

    __slots__ = ("_reduce", "_ser")

    def __init__(
        self,
        backend: KeyedBackend,
        name: str,
        reduce_fn: Callable[[V, V], V],
        serializer: Serializer[V],
    ) -> None:
        super().__init__(backend, name)
        self._reduce = reduce_fn
        self._ser = serializer

    def get(self) -> V | None:
        data = self._backend.get(self._prefix())
        return None if data is None else self._ser.loads(data)

    def add(self, value: V) -> None:
        k = self._prefix()
        data = self._backend.get(k)
        new = value if data is None else self._reduce(self._ser.loads(data), value)
        self._backend.put(k, self._ser.dumps(new))

    def clear(self) -> None:
        self._backend.delete(self._prefix())


class KeyedContext:
    """What a keyed function gets: the current key, the batch id and its states.

    Keyed states are scoped to the current key; operator list states
    (:meth:`operator_list_state`) to the subtask.
    """

    def __init__(
        self,
        backend: KeyedBackend,
        batch_id: int = -1,
        operator_states: OperatorStates | None = None,
    ) -> None:
        self._backend = backend
        self.batch_id = batch_id
        self._states: dict[str, tuple[str, Any]] = {}
        self._operator_states = operator_states

    def operator_list_state(
        self, name: str, serializer: Serializer[V], mode: str = "split"
    ) -> OperatorListState[V]:
        """The subtask's (non-keyed) list called ``name``, whatever the current key.

        On a rescale its elements are redistributed by ``mode``: ``"split"``
        (the old lists, concatenated, cut evenly) or ``"union"`` (every
        subtask gets all); see :mod:`dstl_client.state.operator_state`.
        """
        if self._operator_states is None:
            raise InvalidArgument(
                "operator state needs checkpoints: it is not available in sorted (bounded) mode"
            )
        return self._operator_states.list_state(name, serializer, mode)

    @property
    def current_key(self) -> object:
        return self._backend.current_key

    def set_current_key(self, key: object) -> None:
        self._backend.set_current_key(key)

    def _state(self, name: str, kind: str, make: Callable[[], Any], args: tuple[Any, ...]) -> Any:
        found = self._states.get(name)
        if found is not None:
            if found[0] != kind:
                raise InvalidArgument(f"state {name!r} is a {found[0]}, not a {kind}")
            state, old_args = found[1]
            if len(old_args) == len(args) and all(
                a is b for a, b in zip(old_args, args, strict=True)
            ):
                return state
        elif not name:
            raise InvalidArgument("a state needs a name")
        state = make()
        self._states[name] = (kind, (state, args))
        return state

    def value_state(self, name: str, serializer: Serializer[V]) -> ValueState[V]:
        """The :class:`ValueState` called ``name``."""
        return self._state(  # type: ignore[no-any-return]
            name, "value state", lambda: ValueState(self._backend, name, serializer), (serializer,)
        )

    def list_state(self, name: str, serializer: Serializer[V]) -> ListState[V]:
        """The :class:`ListState` called ``name``."""
        return self._state(  # type: ignore[no-any-return]
            name, "list state", lambda: ListState(self._backend, name, serializer), (serializer,)
        )

    def map_state(
        self, name: str, key_serializer: Serializer[K], value_serializer: Serializer[V]
    ) -> MapState[K, V]:
        """The :class:`MapState` called ``name``."""
        return self._state(  # type: ignore[no-any-return]
            name,
            "map state",
            lambda: MapState(self._backend, name, key_serializer, value_serializer),
            (key_serializer, value_serializer),
        )

    def reducing_state(
        self, name: str, reduce_fn: Callable[[V, V], V], serializer: Serializer[V]
    ) -> ReducingState[V]:
        """The :class:`ReducingState` called ``name``."""
        return self._state(  # type: ignore[no-any-return]
            name,
            "reducing state",
            lambda: ReducingState(self._backend, name, reduce_fn, serializer),
            (reduce_fn, serializer),
        )
