"""Sorted mode in real PySpark jobs: a bounded DataFrame through ``process_bounded`` gives what
Python computes, and what the streaming keyed mode gives on the same data."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.bounded import process_bounded, sorted_mode
from dstl_client.core.errors import ConfigError
from dstl_client.processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from dstl_client.spark import process_keyed
from dstl_client.state import INT64, TupleSerializer
from dstl_server.testing import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS = 12_000
KEYS = 900
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
AGG: TupleSerializer[Any] = TupleSerializer(INT64, INT64)


def _data() -> list[tuple[str, int, dt.datetime]]:
    # keys in a scrambled order, event times not in arrival order within a key
    return [
        (f"k{(i * 7919) % KEYS:04d}", i % 97, T0 + dt.timedelta(seconds=(i * 31) % 5000))
        for i in range(ROWS)
    ]


def _write(directory: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    data = _data()
    for part in range(3):  # three files: the streaming query reads them in one batch
        chunk = data[part::3]
        pq.write_table(
            pa.table(
                {
                    "k": [k for k, _, _ in chunk],
                    "v": pa.array([v for _, v, _ in chunk], pa.int64()),
                    "ts": pa.array([t for _, _, t in chunk], pa.timestamp("us", tz="UTC")),
                }
            ),
            directory / f"part-{part}.parquet",
        )


def count_and_sum(key: Any, rows: list[dict[str, Any]], ctx: Any) -> Iterator[Any]:
    """The keyed function, the same in both modes."""
    state = ctx.value_state("agg", AGG)
    n, total = state.value() or (0, 0)
    for r in rows:
        n += 1
        total += r["v"]
    state.update((n, total))
    yield key, n, total


def _expected_counts() -> set[tuple[str, int, int]]:
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for k, v, _ in _data():
        acc[k][0] += 1
        acc[k][1] += v
    return {(k, n, t) for k, (n, t) in acc.items()}


SCHEMA = "k string, n long, total long"


def test_sorted_mode_equals_python_and_the_streaming_keyed_mode(
    tmp_path: Path, spark: Any, sidecar: ServerProcess
) -> None:
    _write(tmp_path / "input")
    bounded = spark.read.parquet(str(tmp_path / "input"))
    assert sorted_mode(bounded)
    out = process_bounded(bounded, key="k", fn=count_and_sum, output_schema=SCHEMA, parallelism=3)
    got = {tuple(r) for r in out.collect()}
    want = _expected_counts()
    assert got == want

    # the same function and data through the streaming keyed mode (one batch, a sidecar)
    streamed: set[tuple[Any, ...]] = set()

    def sink(df: Any, batch_id: int) -> None:
        streamed.update(tuple(r) for r in df.collect())

    stream = spark.readStream.schema(bounded.schema).parquet(str(tmp_path / "input"))
    assert not sorted_mode(stream)
    q = process_keyed(
        stream,
        key="k",
        fn=count_and_sum,
        output_schema=SCHEMA,
        parallelism=2,
        checkpoint_dir=str(tmp_path / "ckpt"),
        job_id="e2e-bounded",
        dstl_address=sidecar.address,
        state_dir=str(tmp_path / "state"),
        trigger={"availableNow": True},
        sink=sink,
    )
    try:
        q.await_termination(120)
    finally:
        q.stop()
    assert streamed == want


class Sessions(StatefulProcessor):
    """Event time: a key's rows arrive in event-time order; a timer per row at ``ts + 1 h``
    fires at the end of the key, in timestamp order; the initial state adds to the count."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.times = handle.getListState("times", "t timestamp")
        self.fired = handle.getValueState("fired", "n long, last long, ok boolean")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        self.count.update((initialState["n"],))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        n = (self.count.get() or (0,))[0]
        for row in rows:
            n += 1
            self.times.appendValue((row["ts"],))
            ms = int(row["ts"].timestamp() * 1000)
            self.handle.registerTimer(ms + 3_600_000)
        self.count.update((n,))
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Any:
        from pyspark.sql import Row

        ms = expiredTimerInfo.getExpiryTimeInMs()
        fired, last, in_order = self.fired.get() or (0, -1, True)
        in_order = in_order and ms > last
        self.fired.update((fired + 1, ms, in_order))
        if list(self.handle.listTimers()) == [ms]:  # the key's last timer
            times = [t for (t,) in self.times.get()]
            yield Row(
                k=key[0],
                n=(self.count.get() or (0,))[0],
                ordered=times == sorted(times) and in_order,
                timers=fired + 1,
            )


def test_a_processor_in_sorted_mode_with_event_time_timers_and_initial_state(
    tmp_path: Path, spark: Any
) -> None:
    _write(tmp_path / "input")
    bounded = spark.read.parquet(str(tmp_path / "input"))
    initial = spark.createDataFrame([("k0001", 1000), ("zzz", 5)], "k string, n long")
    out = process_bounded(
        bounded.groupBy("k"),
        processor=Sessions(),
        output_schema="k string, n long, ordered boolean, timers long",
        time_mode="EventTime",
        event_time_column="ts",
        use_pandas=False,
        initial_state=initial,
        parallelism=2,
    )
    got = {r["k"]: (r["n"], r["ordered"], r["timers"]) for r in out.collect()}
    per_key: dict[str, set[dt.datetime]] = defaultdict(set)
    rows: dict[str, int] = defaultdict(int)
    for k, _, t in _data():
        per_key[k].add(t)
        rows[k] += 1
    # the last timer of each key fires last (timestamp order), with every timer still there
    want = {k: (rows[k] + (1000 if k == "k0001" else 0), True, len(per_key[k])) for k in rows}
    assert got == want


def test_the_mode_follows_is_streaming_and_bounded_only_takes_bounded_input(
    tmp_path: Path, spark: Any
) -> None:
    _write(tmp_path / "input")
    stream = spark.readStream.schema("k string, v long, ts timestamp").parquet(
        str(tmp_path / "input")
    )
    bounded = spark.read.parquet(str(tmp_path / "input"))
    with pytest.raises(ConfigError, match="needs a bounded DataFrame"):
        process_bounded(stream, key="k", fn=count_and_sum, output_schema=SCHEMA)
    with pytest.raises(ConfigError, match="needs a bounded DataFrame"):
        sorted_mode(stream, "sorted")
    with pytest.raises(ConfigError, match="needs a streaming DataFrame"):
        sorted_mode(bounded, "streaming")
    assert sorted_mode(bounded.groupBy("k"), "auto")
    with pytest.raises(ConfigError, match="exactly one"):
        process_bounded(bounded, key="k", output_schema=SCHEMA)
    with pytest.raises(ConfigError, match="no timers or initial state"):
        process_bounded(
            bounded, key="k", fn=count_and_sum, output_schema=SCHEMA, time_mode="EventTime"
        )
    with pytest.raises(TypeError, match="unexpected keyword"):
        process_bounded(bounded, key="k", fn=count_and_sum, output_schema=SCHEMA, nope=1)
    # the streaming query's options are accepted (parallelism used, the rest unused)
    out = process_bounded(
        bounded,
        key="k",
        fn=count_and_sum,
        output_schema=SCHEMA,
        parallelism=1,
        checkpoint_dir="/nowhere",
        dstl_address="127.0.0.1:1",
    )
    assert out.rdd.getNumPartitions() == 1
    assert out.count() == KEYS
    # the streaming entry points pick sorted mode for a bounded DataFrame themselves
    via_keyed = process_keyed(
        bounded, key="k", fn=count_and_sum, output_schema=SCHEMA, parallelism=1
    )
    assert sorted(via_keyed.collect()) == sorted(out.collect())
    with pytest.raises(ConfigError, match="needs a bounded DataFrame"):
        process_keyed(
            stream, key="k", fn=count_and_sum, output_schema=SCHEMA, execution_mode="sorted"
        )
