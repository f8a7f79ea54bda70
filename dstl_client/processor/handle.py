"""``StatefulProcessorHandle``: what a processor's ``init`` (and handlers) ask for state and timers.

Spark's names and meaning: ``getValueState(name, schema, ttlDurationMs=None)``,
``getListState``, ``getMapState(name, userKeySchema, valueSchema,
ttlDurationMs=None)``, ``registerTimer(ms)``, ``deleteTimer(ms)``,
``listTimers()`` (timers belong to the current key), ``deleteIfExists(name)``.
Schemas are a ``StructType`` or a DDL string.

A thin facade over the task's :class:`~.runtime.ProcessorRuntime`. Thread:
the task's thread only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from dstl_client.processor.states import ListState, MapState, ValueState


class ProcessorRuntime(Protocol):
    """What the handle asks of the task's runtime (:class:`~.runtime.ProcessorRuntime`
    implements it; named here so the handle does not import the runtime that builds it)."""

    def value_state(self, name: str, schema: Any, ttl_ms: int | None) -> ValueState: ...

    def list_state(self, name: str, schema: Any, ttl_ms: int | None) -> ListState: ...

    def map_state(
        self, name: str, key_schema: Any, value_schema: Any, ttl_ms: int | None
    ) -> MapState: ...

    def delete_state(self, name: str) -> int: ...

    def register_timer(self, ms: int) -> None: ...

    def delete_timer(self, ms: int) -> None: ...

    def list_timers(self) -> Iterator[int]: ...


class StatefulProcessorHandle:
    """State variables and timers of one task's processor (Spark's ``StatefulProcessorHandle``).

    Invariants are the runtime's (one kind, schema and TTL per name; ``$``
    names reserved; timers and state only while a key is current). Thread:
    the task's thread only.
    """

    __slots__ = ("_runtime",)

    def __init__(self, runtime: ProcessorRuntime) -> None:
        self._runtime = runtime

    def getValueState(
        self, stateName: str, schema: Any, ttlDurationMs: int | None = None
    ) -> ValueState:
        """The value state ``stateName`` (one tuple of ``schema`` per key)."""
        return self._runtime.value_state(stateName, schema, ttlDurationMs)

    def getListState(
        self, stateName: str, schema: Any, ttlDurationMs: int | None = None
    ) -> ListState:
        """The list state ``stateName`` (tuples of ``schema``; each element has its own TTL)."""
        return self._runtime.list_state(stateName, schema, ttlDurationMs)

    def getMapState(
        self,
        stateName: str,
        userKeySchema: Any,
        valueSchema: Any,
        ttlDurationMs: int | None = None,
    ) -> MapState:
        """The map state ``stateName`` (``userKeySchema`` tuples to ``valueSchema`` tuples)."""
        return self._runtime.map_state(stateName, userKeySchema, valueSchema, ttlDurationMs)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        """A timer of the current key: ``handleExpiredTimer`` runs once it is due."""
        self._runtime.register_timer(expiryTimestampMs)

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._runtime.delete_timer(expiryTimestampMs)

    def listTimers(self) -> Iterator[int]:
        """The current key's timers (ms), earliest first."""
        return self._runtime.list_timers()

    def deleteIfExists(self, stateName: str) -> None:
        """Remove the state variable ``stateName`` (every key of this task's key groups)."""
        self._runtime.delete_state(stateName)
