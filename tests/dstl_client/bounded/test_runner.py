"""The sorted runners: ``fn(key, rows, ctx)`` and a ``StatefulProcessor`` one key at a time,
timers at the end of each key, and the processor's own state classes on the single-key backend."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from dstl_client.bounded import (
    KeyOrderError,
    SingleKeyBackend,
    SortedProcessorRunner,
    as_keyed_backend,
    run_sorted,
    run_sorted_processor,
)
from dstl_client.core.errors import InvalidArgument
from dstl_client.processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from dstl_client.processor.codec import RowCodec
from dstl_client.processor.layout import MAX_MS
from dstl_client.processor.states import ListState, MapState, ValueState
from dstl_client.processor.ttl import TtlIndex
from dstl_client.state.api import KeyedContext
from dstl_client.state.serializers import INT64


def running_total(key: Any, rows: list[Any], ctx: KeyedContext) -> Iterator[Any]:
    state = ctx.value_state("n", INT64)
    seen = ctx.list_state("seen", INT64)
    for r in rows:
        state.update((state.value() or 0) + r)
        seen.add(r)
    yield key, state.value(), len(seen.get())


def test_fn_runs_once_per_key_with_fresh_state() -> None:
    out: list[Any] = []
    stats = run_sorted([("a", [1, 2]), ("b", [5]), ("c", [])], running_total, emit=out.append)
    assert out == [("a", 3, 2), ("b", 5, 1), ("c", None, 0)]
    assert (stats.keys, stats.rows, stats.changes) == (3, 3, 6)
    assert stats.max_key_state_rows == 2
    # no emit: outputs are drained (a generator's state changes still happen)
    assert run_sorted([("a", [1])], running_total).changes == 2


def test_out_of_order_or_repeated_keys_are_refused_with_a_clear_error() -> None:
    with pytest.raises(KeyOrderError, match="arrived after key 'b'"):
        run_sorted([("a", [1]), ("b", [1]), ("a", [2])], running_total)
    with pytest.raises(KeyOrderError, match="arrived again"):
        run_sorted([(1, [1]), (1, [2])], running_total)


def test_fn_cannot_switch_the_key() -> None:
    def sneaky(key: Any, rows: list[Any], ctx: KeyedContext) -> None:
        ctx.set_current_key("other")

    with pytest.raises(KeyOrderError, match="user code cannot switch it"):
        run_sorted([("a", [1])], sneaky)


class Timers(StatefulProcessor):
    """Rows are ``("reg"|"del", ms)``; fired timers are output with the state and times."""

    def __init__(self, reregister: bool = False) -> None:
        self.reregister = reregister

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        n = 0
        for op, ms in rows:
            n += 1
            if op == "reg":
                self.handle.registerTimer(ms)
            else:
                self.handle.deleteTimer(ms)
        self.count.update((n,))
        yield (
            "input",
            key[0],
            timerValues.getCurrentWatermarkInMs(),
            list(self.handle.listTimers()),
        )

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        ms = expiredTimerInfo.getExpiryTimeInMs()
        if self.reregister:
            self.handle.registerTimer(ms + 1000)  # dropped: the key's input has ended
        if ms == 20:
            self.handle.deleteTimer(30)  # an earlier handler deletes a later timer
        yield (
            "timer",
            key[0],
            ms,
            self.count.get(),
            timerValues.getCurrentWatermarkInMs(),
            timerValues.getCurrentProcessingTimeInMs(),
        )


def test_event_time_timers_fire_at_the_end_of_each_key_in_timestamp_order() -> None:
    out: list[Any] = []
    groups = [
        ("a", iter([("reg", 50), ("reg", 20), ("reg", 30), ("reg", 10), ("del", 10)])),
        ("b", iter([("reg", 7), ("reg", 7)])),
        ("c", iter([])),
    ]
    stats = run_sorted_processor(
        Timers(), groups, time_mode="EventTime", processing_ms=1234, emit=out.append
    )
    assert out == [
        ("input", "a", -1, [20, 30, 50]),  # no watermark yet while a key's input runs
        # timers after the key's input, before the next key, with the watermark at +inf;
        # 30 was deleted by the handler of 20 and does not fire
        ("timer", "a", 20, (5,), MAX_MS, 1234),
        ("timer", "a", 50, (5,), MAX_MS, 1234),
        ("input", "b", -1, [7]),
        ("timer", "b", 7, (2,), MAX_MS, 1234),
        ("input", "c", -1, []),
    ]
    assert (stats.keys, stats.timers_fired, stats.timers_dropped) == (3, 3, 0)


def test_timers_registered_while_a_keys_timers_fire_are_dropped_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="dstl_client.bounded.runner"):
        stats = run_sorted_processor(
            Timers(reregister=True),
            [("a", iter([("reg", 1), ("reg", 2)])), ("b", iter([("reg", 1)]))],
            time_mode="EventTime",
            emit=out.append,
        )
    assert [o[2] for o in out if o[0] == "timer"] == [1, 2, 1]
    assert stats.timers_dropped == 3
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 1


def test_processing_time_timers_fire_at_the_end_of_each_key_too() -> None:
    out: list[Any] = []
    run_sorted_processor(
        Timers(),
        [("a", iter([("reg", 10**12), ("reg", 5)]))],
        time_mode="ProcessingTime",
        processing_ms=1000,
        emit=out.append,
    )
    # every processing-time timer fires when the key ends (Flink's batch mode), in time order
    assert [(o[2], o[4], o[5]) for o in out if o[0] == "timer"] == [
        (5, -1, 1000),
        (10**12, -1, 1000),
    ]


def test_time_mode_none_refuses_timers_and_state_needs_a_key() -> None:
    with pytest.raises(InvalidArgument, match="timers need time mode"):
        run_sorted_processor(Timers(), [("a", iter([("reg", 1)]))])

    class StateInInit(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            handle.getValueState("v", "n long").get()

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
            return iter(())

    with pytest.raises(InvalidArgument, match="not in init"):
        run_sorted_processor(StateInInit(), [("a", iter([]))])


class AllStates(StatefulProcessor):
    """Value, list (with a TTL) and map state, an initial state, deleteIfExists."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        handle.deleteIfExists("retired")
        self.handle = handle
        self.total = handle.getValueState("total", "n long")
        self.items = handle.getListState("items", "v long", ttlDurationMs=60_000)
        self.pages = handle.getMapState("pages", "page string", "n long")
        self.closed = False

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        self.total.update((initialState,))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        assert not self.pages.exists()  # a new key starts with empty state
        n = (self.total.get() or (0,))[0]
        for v, page in rows:
            n += v
            self.items.appendValue((v,))
            seen = self.pages.getValue((page,))
            self.pages.updateValue((page,), ((seen[0] if seen else 0) + 1,))
        self.total.update((n,))
        self.handle.deleteIfExists("retired")
        yield (
            key[0],
            n,
            [v for (v,) in self.items.get()],
            sorted((k[0], c[0]) for k, c in self.pages.iterator()),
        )

    def close(self) -> None:
        self.closed = True


def test_processor_states_initial_state_and_close() -> None:
    out: list[Any] = []
    proc = AllStates()
    stats = run_sorted_processor(
        proc,
        [("a", iter([(1, "p"), (2, "q"), (3, "p")])), ("c", iter([(4, "p")]))],
        time_mode="ProcessingTime",
        processing_ms=10_000,
        emit=out.append,
        initial=[("a", [100]), ("b", [7]), ("c", [1, 2])],  # "b": initial state, no input
    )
    assert out == [
        ("a", 106, [1, 2, 3], [("p", 2), ("q", 1)]),
        ("c", 6, [4], [("p", 1)]),
    ]
    assert proc.closed and stats.keys == 3


def test_the_processor_state_classes_take_the_single_key_backend_directly() -> None:
    """``ValueState``/``ListState``/``MapState`` are built over any scope with a backend."""
    backend = SingleKeyBackend()

    class Scope:
        def __init__(self) -> None:
            self.backend = as_keyed_backend(backend)
            self.ttl_index = TtlIndex(self.backend)
            self.now_ms = 0

        def require_key(self) -> None:
            assert backend.held_rows >= 0

    scope = Scope()
    value = ValueState(scope, "v", RowCodec("n long"), None)
    items = ListState(scope, "l", RowCodec("s string"), 100)
    pages = MapState(scope, "m", RowCodec("k string"), RowCodec("n long"), None)
    backend.start_key("k1")
    value.update((3,))
    items.appendList([("x",), ("y",)])
    pages.updateValue(("a",), (1,))
    assert value.get() == (3,) and [s for (s,) in items.get()] == ["x", "y"]
    assert list(pages.keys()) == [("a",)]
    backend.start_key("k2")
    assert value.get() is None and not items.exists() and not pages.exists()


def test_the_runner_owns_the_key() -> None:
    class Switcher(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.v = handle.getValueState("v", "n long")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
            runner.backend.set_current_key("elsewhere")
            return iter(())

    runner = SortedProcessorRunner(Switcher())
    runner.open()
    with pytest.raises(KeyOrderError):
        runner.process("a", iter([]))
    with pytest.raises(KeyOrderError, match="not sorted"):
        runner.process("0", iter([]))
