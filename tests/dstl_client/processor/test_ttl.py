"""State variables with Spark's names, TTL on an injected clock, and the handle's rules."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.client import ChangelogClient
from dstl_client.core.errors import InvalidArgument
from dstl_client.processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from dstl_server.testing import ServerProcess
from tests.dstl_client.processor._harness import ProcessorHarness, coordinator

TTL_MS = 100


class Expiring(StatefulProcessor):
    """``set`` rows write a value, a list element and a map entry (all with a TTL);
    every key outputs what it can read after its rows."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.value = handle.getValueState("value", "x long", ttlDurationMs=TTL_MS)
        self.items = handle.getListState("items", "x long", ttlDurationMs=TTL_MS)
        self.entries = handle.getMapState("entries", "k string", "x long", ttlDurationMs=TTL_MS)
        self.kept = handle.getValueState("kept", "x long")  # no TTL

    def handleInputRows(
        self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[Any]:
        for row in rows:
            if "x" in row:
                self.value.update((row["x"],))
                self.items.appendValue((row["x"],))
                self.entries.updateValue((row["mk"],), (row["x"],))
                self.kept.update((row["x"],))
        yield (
            key[0],
            self.value.get(),
            [v[0] for v in self.items.get()],
            {k[0]: v[0] for k, v in self.entries.iterator()},
            self.value.exists(),
            self.items.exists(),
            self.entries.exists(),
            self.entries.containsKey(("a",)),
        )


def test_values_expire_at_the_processing_time_plus_ttl_and_are_cleaned_up(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    times = {0: 1000, 1: 1050, 2: 1100, 3: 1120, 4: 1150, 5: 1150}
    h = ProcessorHarness(
        coordinator(tmp_path, sidecar.address, "ttl"),
        Expiring,
        client,
        parallelism=1,
        clock=times.__getitem__,
    )
    # t=1000: a=1 expires at 1100
    run = h.run_batch(0, [{"k": "u", "x": 1, "mk": "a"}])
    assert run is not None
    assert run.outputs == [("u", (1,), [1], {"a": 1}, True, True, True, True)]
    # t=1050: everything visible; b=2 expires at 1150, the value too (an update renews it)
    run = h.run_batch(1, [{"k": "u", "x": 2, "mk": "b"}])
    assert run is not None
    assert run.outputs == [("u", (2,), [1, 2], {"a": 1, "b": 2}, True, True, True, True)]
    # t=1100: what was written at 1000 is gone (expiry <= now), to reads and from the store
    run = h.run_batch(2, [{"k": "u"}])
    assert run is not None
    assert run.outputs == [("u", (2,), [2], {"b": 2}, True, True, True, False)]
    assert run.stats.ttl_evicted == 2  # the first list element and map entry
    # the lost disk: expiries come back with the state
    shutil.rmtree(tmp_path / "state")
    run = h.run_batch(3, [{"k": "u"}])
    assert run is not None
    assert run.outputs == [("u", (2,), [2], {"b": 2}, True, True, True, False)]
    assert all(r.stats.restored for r in run.results)
    rows_before = run.stats.state_rows
    # t=1150: all expired; only the value without a TTL is left in the store
    run = h.run_batch(4, [{"k": "u"}])
    assert run is not None
    assert run.outputs == [("u", None, [], {}, False, False, False, False)]
    assert run.stats.ttl_evicted == 3
    assert run.stats.state_rows == 1 < rows_before
    h.coordinator.close()


class Misuse(StatefulProcessor):
    """Does in ``init`` or ``handleInputRows`` what the row's ``do`` says."""

    def __init__(self, in_init: str = "") -> None:
        self.in_init = in_init

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.value = handle.getValueState("v", "x long")
        self.items = handle.getListState("l", "x long")
        self.entries = handle.getMapState("m", "k long", "x string")
        if self.in_init == "reserved":
            handle.getValueState("$timers", "x long")
        elif self.in_init == "twice":
            handle.getListState("v", "x long")
        elif self.in_init == "other schema":
            handle.getValueState("v", "x string")
        elif self.in_init == "ttl without time":
            handle.getValueState("t", "x long", ttlDurationMs=5)
        elif self.in_init == "read":
            self.value.get()
        elif self.in_init == "drop":
            handle.deleteIfExists("l")
            self.items = handle.getListState("l", "x long")  # declared anew: empty
        elif self.in_init == "drop and use":
            handle.deleteIfExists("l")  # self.items is gone: using it raises, as in Spark

    def handleInputRows(
        self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[Any]:
        for row in rows:
            if row.get("do") == "fill":
                self.value.update((1,))
                self.items.put([(1,), (2,)])
                self.items.appendList([(3,)])
                self.entries.updateValue((7,), ("seven",))
                self.entries.updateValue((8,), ("eight",))
                self.entries.removeKey((8,))
            elif row.get("do") == "bad value":
                self.value.update(("not a number",))
            elif row.get("do") == "clear":
                self.value.clear()
                self.items.clear()
                self.entries.clear()
        yield (
            key[0],
            self.value.get(),
            list(self.items.get()),
            list(self.entries.keys()),
            list(self.entries.values()),
            self.entries.getValue((7,)),
            timerValues.getCurrentProcessingTimeInMs(),
        )


def test_states_have_sparks_methods_and_the_handle_enforces_its_rules(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    h = ProcessorHarness(
        coordinator(tmp_path, sidecar.address, "rules"), Misuse, client, time_mode="None"
    )
    run = h.run_batch(0, [{"k": "a", "do": "fill"}, {"k": "b"}])
    assert run is not None
    assert sorted(run.outputs) == [
        ("a", (1,), [(1,), (2,), (3,)], [(7,)], [("seven",)], ("seven",), -1),
        ("b", None, [], [], [], None, -1),
    ]
    run = h.run_batch(1, [{"k": "a"}])
    assert run is not None
    assert run.outputs == [("a", (1,), [(1,), (2,), (3,)], [(7,)], [("seven",)], ("seven",), -1)]
    h.make = lambda: Misuse("drop")  # deleteIfExists: the list is gone for every key
    run = h.run_batch(2, [{"k": "a"}])
    assert run is not None
    assert run.outputs == [("a", (1,), [], [(7,)], [("seven",)], ("seven",), -1)]
    h.make = Misuse
    run = h.run_batch(3, [{"k": "a", "do": "clear"}])
    assert run is not None
    assert run.outputs == [("a", None, [], [], [], None, -1)]
    assert run.stats.state_rows == 0
    for job, in_init, message in [
        ("r1", "reserved", "reserved"),
        ("r2", "twice", "already a value state"),
        ("r3", "other schema", "other schema"),
        ("r4", "ttl without time", "ProcessingTime or EventTime"),
        ("r5", "read", "belong to a key"),
        ("r6", "drop and use", "list state 'l' was deleted"),
    ]:
        bad = ProcessorHarness(
            coordinator(tmp_path / job, sidecar.address, job),
            lambda in_init=in_init: Misuse(in_init),  # type: ignore[misc]
            client,
            time_mode="None",
        )
        with pytest.raises(InvalidArgument, match=message):
            bad.run_batch(0, [{"k": "a"}])
        bad.coordinator.close()
    with pytest.raises(InvalidArgument, match="field 'x'"):
        h.run_batch(4, [{"k": "a", "do": "bad value"}])
    h.coordinator.close()


class Seeded(StatefulProcessor):
    """Counts rows per key on top of an initial count."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        self.count.update((initialState,))

    def handleInputRows(
        self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[Any]:
        n = (self.count.get() or (0,))[0] + len(list(rows))
        self.count.update((n,))
        yield (key[0], n)


def test_the_initial_state_is_applied_in_the_first_batch_only(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    h = ProcessorHarness(
        coordinator(tmp_path, sidecar.address, "seeded"),
        Seeded,
        client,
        time_mode="None",
        initial={"a": [10], "z": [1]},
    )
    first = h.run_tasks(0, [{"k": "a"}, {"k": "b"}])  # the first attempt's record is lost
    assert first is not None and first.stats.initial_state_rows == 2
    run = h.run_batch(0, [{"k": "a"}, {"k": "b"}])
    assert run is not None and sorted(run.outputs) == [("a", 11), ("b", 1)]
    run = h.run_batch(1, [{"k": "a"}, {"k": "z"}])
    assert run is not None and sorted(run.outputs) == [("a", 12), ("z", 2)]
    assert run.stats.initial_state_rows == 0
    h.coordinator.close()
