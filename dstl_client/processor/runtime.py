"""One task's processor runtime: its state variables, timers and TTL index over the backend.

The runtime is the :class:`~.handle.StatefulProcessorHandle`'s back end and
what the task loop (:mod:`.runner`) drives: it sets the current key before
each ``handle*`` call, fires the expired timers of the task's key groups in
timestamp order after the input rows, then runs the TTL cleanup pass.

Invariants: a state name has one kind, schema and TTL in a task (asking
again with the same ones returns the same variable, with others raises);
names starting with ``$`` are reserved; timers need time mode
``ProcessingTime`` or ``EventTime`` and TTL needs one of them too (the
processing time); state and timers are only reachable while a key is
current. Thread: the task's thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dstl_client.core.errors import InvalidArgument
from dstl_client.processor.api import ExpiredTimerInfo, StatefulProcessor, TimerValues
from dstl_client.processor.codec import RowCodec
from dstl_client.processor.handle import StatefulProcessorHandle
from dstl_client.processor.layout import check_state_name
from dstl_client.processor.states import ListState, MapState, StateVariable, ValueState
from dstl_client.processor.timers import TimerService
from dstl_client.processor.times import BatchTimes
from dstl_client.processor.ttl import TtlIndex
from dstl_client.state.changes import map_prefix_of, prefix_end
from dstl_client.state.keyed_backend import KeyedBackend
from dstl_client.state.serializers import encode_varint

Emit = Callable[[Any], None]


def drain(out: Any, emit: Emit | None) -> None:
    """Pass what a handler returned (an iterator, a DataFrame or ``None``) on to ``emit``."""
    if out is None:
        return
    if hasattr(out, "columns") and hasattr(out, "iloc"):  # one pandas DataFrame
        if emit is not None:
            emit(out)
        return
    if emit is None:
        for _ in out:
            pass
    else:
        for item in out:
            emit(item)


class ProcessorRuntime:
    """State variables, timers and TTL of one task (see the module documentation)."""

    def __init__(
        self,
        backend: KeyedBackend,
        *,
        time_mode: str,
        times: BatchTimes,
        key_of: Callable[[bytes], Any],
    ) -> None:
        self._backend = backend
        self.time_mode = time_mode
        self.times = times
        self._key_of = key_of
        self._vars: dict[str, StateVariable] = {}
        self._signatures: dict[str, tuple[Any, ...]] = {}
        self.timers = TimerService(backend)
        self._ttl = TtlIndex(backend)
        self._key: Any = None
        self._key_set = False
        self.timer_values: TimerValues = times.timer_values(time_mode)
        self.handle = StatefulProcessorHandle(self)

    # ---------------------------------------------------------- StateScope
    @property
    def backend(self) -> KeyedBackend:
        return self._backend

    @property
    def ttl_index(self) -> TtlIndex:
        return self._ttl

    @property
    def now_ms(self) -> int:
        return self.times.processing_ms

    def require_key(self) -> None:
        if not self._key_set:
            raise InvalidArgument(
                "state and timers belong to a key: use them in handleInputRows, "
                "handleExpiredTimer or handleInitialState, not in init"
            )

    # ------------------------------------------------------------- the key
    def enter_key(self, key: Any) -> tuple[Any, ...]:
        """Make ``key`` current; the grouping key tuple the handlers get."""
        self._backend.set_current_key(key)
        self._key = key
        self._key_set = True
        return (key,)

    def leave_key(self) -> None:
        self._key = None
        self._key_set = False

    # ---------------------------------------------------------- variables
    def _check_ttl(self, name: str, ttl_ms: int | None) -> None:
        if ttl_ms is None:
            return
        if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
            raise InvalidArgument(f"state {name!r}: ttlDurationMs must be a positive int")
        if self.time_mode == "None":
            raise InvalidArgument(
                f"state {name!r} has a TTL: use time mode ProcessingTime or EventTime"
            )

    def _declare(
        self, name: str, signature: tuple[Any, ...], make: Callable[[], StateVariable]
    ) -> StateVariable:
        check_state_name(name)
        old = self._signatures.get(name)
        if old is not None:
            if old != signature:
                raise InvalidArgument(
                    f"state {name!r} is already a {old[0]} of other schema or TTL in this task"
                )
            return self._vars[name]
        var = make()
        self._vars[name] = var
        self._signatures[name] = signature
        return var

    def value_state(self, name: str, schema: Any, ttl_ms: int | None) -> ValueState:
        self._check_ttl(name, ttl_ms)
        codec = RowCodec(schema)
        var = self._declare(
            name,
            ("value state", codec.schema, ttl_ms),
            lambda: ValueState(self, name, codec, ttl_ms),
        )
        assert isinstance(var, ValueState)
        return var

    def list_state(self, name: str, schema: Any, ttl_ms: int | None) -> ListState:
        self._check_ttl(name, ttl_ms)
        codec = RowCodec(schema)
        var = self._declare(
            name,
            ("list state", codec.schema, ttl_ms),
            lambda: ListState(self, name, codec, ttl_ms),
        )
        assert isinstance(var, ListState)
        return var

    def map_state(
        self, name: str, key_schema: Any, value_schema: Any, ttl_ms: int | None
    ) -> MapState:
        self._check_ttl(name, ttl_ms)
        key_codec = RowCodec(key_schema)
        value_codec = RowCodec(value_schema)
        var = self._declare(
            name,
            ("map state", key_codec.schema, value_codec.schema, ttl_ms),
            lambda: MapState(self, name, key_codec, value_codec, ttl_ms),
        )
        assert isinstance(var, MapState)
        return var

    def delete_state(self, name: str) -> int:
        """Delete every row of the variable ``name`` in the task's key groups; how many.

        A variable of that name handed out before can no longer be used.
        """
        check_state_name(name)
        var = self._vars.pop(name, None)
        if var is not None:  # as in Spark: the variable is gone, a new get* declares it again
            var.deleted = True
            del self._signatures[name]
        name_bytes = name.encode("utf-8")
        start = encode_varint(len(name_bytes)) + name_bytes
        end = prefix_end(start)
        backend = self._backend
        deleted = 0
        for kg in backend.kg_range:
            rows = backend.scan_range(kg, start, end)
            if not rows:
                continue
            backend.set_current_key_group(kg)
            for k, _ in rows:
                in_map = map_prefix_of(k)
                if in_map is None:
                    backend.delete(k)
                else:
                    backend.map_delete(in_map, k)
                deleted += 1
        if self._key_set:  # a handler called it: its key stays current
            backend.set_current_key(self._key)
        return deleted

    # -------------------------------------------------------------- timers
    def _timers_allowed(self) -> None:
        if self.time_mode == "None":
            raise InvalidArgument("timers need time mode ProcessingTime or EventTime")
        self.require_key()

    def register_timer(self, ms: int) -> None:
        self._timers_allowed()
        self.timers.register(ms)

    def delete_timer(self, ms: int) -> None:
        self._timers_allowed()
        self.timers.delete(ms)

    def list_timers(self) -> Iterator[int]:
        self._timers_allowed()
        return self.timers.listed()

    def fire_timers(self, processor: StatefulProcessor, emit: Emit | None) -> int:
        """Call ``handleExpiredTimer`` for every due timer of the task's key groups, in
        timestamp order (keys without input included); each fires once. How many fired.

        The due timers are found before the first fires: one registered by a
        handler for a time already due fires in the next batch. A timer
        deleted by an earlier handler of this pass does not fire.
        """
        due_at = self.times.timers_due_at(self.time_mode)
        if due_at is None:
            return 0
        fired = 0
        values = self.timer_values
        for ms, key_bytes in self.timers.expired(due_at):
            key = self._key_of(key_bytes)
            grouping = self.enter_key(key)
            if not self.timers.exists(ms):
                continue
            drain(processor.handleExpiredTimer(grouping, values, ExpiredTimerInfo(ms)), emit)
            # as in Spark: removed once its handler has run
            self.timers.delete(ms)
            fired += 1
        self.leave_key()
        return fired

    # ----------------------------------------------------------------- TTL
    def evict_expired(self) -> int:
        """The cleanup pass: remove values whose TTL ran out at the batch's processing time.

        Scans the due part of each key group's TTL index only. Returns how many
        values (elements, entries) were removed.
        """
        if self.time_mode == "None" or self.now_ms < 0:
            return 0
        now = self.now_ms
        evicted = 0
        for entry in self._ttl.due(now):
            self.enter_key(entry.key)
            self._ttl.remove(entry)
            var = self._vars.get(entry.name.decode("utf-8", "replace"))
            if var is not None and var.ttl_ms is not None:
                evicted += var.evict(entry.user_key, now)
        self.leave_key()
        return evicted
