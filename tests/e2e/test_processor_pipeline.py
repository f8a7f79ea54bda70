"""The output of ``transform_with_state`` as users go on with it: the memory sink's view in
their session, stateless steps after the operator, a second stateful stage on the first's
event time (Spark's chaining with ``eventTimeColumnName``), and typed errors for the rest."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from dstl_client.core.errors import ConfigError
from dstl_client.processor import StatefulProcessor, transform_with_state
from dstl_server.testing import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHAINED_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "processor_chained.py"
#: 2024-01-01T00:00:00Z, the example's time origin, in seconds since the epoch
T0_S = 1_704_067_200

#: per batch (one input file each): (key, value)
COUNT_BATCHES = [
    [("a", 1), ("b", 2), ("a", 3)],
    [("b", 4), ("c", 5)],
    [("a", 6)],
]


class RunningSum(StatefulProcessor):
    """Per key: the running count and sum of ``v`` (``Row``\\ s in and out)."""

    def init(self, handle: Any) -> None:
        self.total = handle.getValueState("total", "n long, s long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Any:
        from pyspark.sql import Row

        got = self.total.get()
        n, s = (0, 0) if got is None else (got[0], got[1])
        for row in rows:
            n, s = n + 1, s + row.v
        self.total.update((n, s))
        yield Row(k=key[0], n=n, s=s)


def _write_batches(directory: Path, batches: list[list[tuple[str, int]]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 1000
    for b, rows in enumerate(batches):
        table = pa.table(
            {"k": [k for k, _ in rows], "v": pa.array([v for _, v in rows], pa.int64())}
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


def _model(batches: list[list[tuple[str, int]]]) -> list[tuple[str, int, int]]:
    """Every output row ``(k, n, s)`` of :class:`RunningSum` over ``batches``."""
    n: dict[str, int] = {}
    s: dict[str, int] = {}
    out = []
    for rows in batches:
        for k in dict.fromkeys(k for k, _ in rows):
            for key, v in rows:
                if key == k:
                    n[k] = n.get(k, 0) + 1
                    s[k] = s.get(k, 0) + v
            out.append((k, n[k], s[k]))
    return sorted(out)


def _running_sum(spark: Any, tmp: Path, sidecar: ServerProcess) -> Any:
    events = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp / "input"))
    )
    return transform_with_state(
        events.groupBy("k"),
        processor=RunningSum(),
        output_schema="k string, n long, s long",
        use_pandas=False,
        parallelism=2,
        max_parallelism=16,
        dstl_address=sidecar.address,
        state_dir=str(tmp / "state"),
    )


def test_the_memory_sink_is_a_view_of_the_users_session_during_and_after_the_query(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    _write_batches(tmp_path / "input", COUNT_BATCHES)
    name = "dstl_memory_view"
    q = (
        _running_sum(spark, tmp_path, sidecar)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        # as Spark's memory sink: readable as soon as the query started, with its schema
        assert spark.table(name).columns == ["k", "n", "s"]
        q.wait_for_batch(len(COUNT_BATCHES) - 1, timeout_s=180)
        during = sorted(tuple(r) for r in spark.sql(f"select * from {name}").collect())
        assert during == _model(COUNT_BATCHES)
        assert spark.sql(f"select sum(n) from {name}").collect()[0][0] == sum(
            n for _, n, _ in _model(COUNT_BATCHES)
        )
    finally:
        q.stop()
    after = sorted(tuple(r) for r in spark.table(name).collect())
    assert after == _model(COUNT_BATCHES)


def test_what_cannot_follow_the_operator_is_refused_naming_what_can(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    (tmp_path / "input").mkdir()
    out = _running_sum(spark, tmp_path, sidecar)
    # stateless steps are checked once, on the output's schema
    assert out.select("k", "s").where("s > 1").withColumn("twice", F.col("s") * 2).columns == [
        "k",
        "s",
        "twice",
    ]
    with pytest.raises(ConfigError, match=r"not stateless \(Aggregate\).*stateful stage"):
        out.then(lambda df: df.groupBy("k").count())
    with pytest.raises(ConfigError, match=r"Sort"):
        out.then(lambda df: df.orderBy("k"))
    with pytest.raises(ConfigError, match=r"Deduplicate"):
        out.then(lambda df: df.dropDuplicates(["k"]))
    with pytest.raises(ConfigError, match=r"returns a DataFrame"):
        out.then(lambda df: df.collect())
    # Spark's DataFrame and GroupedData methods name the supported shapes
    attempts: list[Callable[[], Any]] = [
        lambda: out.withWatermark("s", "1 second"),
        lambda: out.join(out, "k"),
        lambda: out.groupBy("k").count(),
        lambda: out.groupBy("k").agg(F.max("s")),
    ]
    for attempt in attempts:
        with pytest.raises(ConfigError, match=r"after transform_with_state come: .*writeStream"):
            attempt()
    with pytest.raises(AttributeError):
        out.no_such_method  # noqa: B018 - what is not Spark's stays an AttributeError
    # a second stateful stage: event time only from output_event_time_column
    with pytest.raises(ConfigError, match=r"EventTime after transform_with_state needs"):
        transform_with_state(
            out.groupBy("k"),
            processor=RunningSum(),
            output_schema="k string, n long, s long",
            time_mode="EventTime",
        )
    with pytest.raises(ConfigError, match=r"query's other options"):
        transform_with_state(
            out, key="k", processor=RunningSum(), output_schema="k string", checkpoint_dir="x"
        )
    events = spark.readStream.schema("k string, v long, ts timestamp").parquet(str(tmp_path))
    with pytest.raises(ConfigError, match=r"output_event_time_column 'n' must be a timestamp"):
        transform_with_state(
            events.groupBy("k"),
            processor=RunningSum(),
            output_schema="k string, n long, s long",
            event_time_column="ts",
            watermark_delay="1 second",
            output_event_time_column="n",
        )
    with pytest.raises(ConfigError, match=r"the input has none"):
        transform_with_state(
            events.groupBy("k"),
            processor=RunningSum(),
            output_schema="k string, n long, at timestamp",
            output_event_time_column="at",
        )


def test_stateless_steps_apply_to_each_batchs_output_before_the_sink(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    _write_batches(tmp_path / "input", COUNT_BATCHES)
    got: dict[int, list[tuple[Any, ...]]] = {}

    def collect(df: Any, batch_id: int) -> None:
        got[batch_id] = sorted(tuple(r) for r in df.collect())

    q = (
        _running_sum(spark, tmp_path, sidecar)
        .where(F.col("n") > 1)
        .select("k", (F.col("s") * 10).alias("s10"))
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        q.wait_for_batch(len(COUNT_BATCHES) - 1, timeout_s=180)
    finally:
        q.stop()
    want = sorted((k, s * 10) for k, n, s in _model(COUNT_BATCHES) if n > 1)
    assert sorted(r for rows in got.values() for r in rows) == want


def _example() -> Any:
    """``examples/processor_chained.py`` as a module whose classes pickle by value."""
    import importlib.util
    import sys

    from pyspark import cloudpickle

    name = "dstl_example_processor_chained"
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location(name, CHAINED_EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return module


def _window_rows(rows: list[Any]) -> set[tuple[Any, ...]]:
    return {(r[0], r[1], int(r[2]), int(r[3])) for r in rows}


def test_an_event_time_processor_chained_into_a_windowed_aggregation_gives_sparks_windows(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    ex = _example()
    ex.write_clicks(tmp_path / "input")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)

    def clicks() -> Any:
        return (
            spark.readStream.schema("user string, ts timestamp")
            .option("maxFilesPerTrigger", 1)
            .json(str(tmp_path / "input"))
        )

    # Spark: transformWithStateInPandas with eventTimeColumnName, then a windowed aggregation
    by_spark: list[Any] = []
    q = (
        clicks()
        .withWatermark("ts", ex.DELAY)
        .groupBy("user")
        .transformWithStateInPandas(
            ex.Sessions(),
            ex.SESSION_SCHEMA,
            "Append",
            "EventTime",
            eventTimeColumnName="session_end",
        )
        .groupBy(F.window("session_end", f"{ex.WINDOW_MS // 1000} seconds"))
        .agg(F.count("*").alias("sessions"), F.sum("clicks").alias("clicks"))
        .select("window.start", "window.end", "sessions", "clicks")
        .writeStream.foreachBatch(lambda df, _: by_spark.extend(df.collect()))
        .option("checkpointLocation", str(tmp_path / "spark-ckpt"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    # dstl: the example's two stages (a stateless step between them), one query
    dq = (
        ex.session_windows(
            clicks(), dstl_address=sidecar.address, state_dir=str(tmp_path / "state")
        )
        .writeStream.format("memory")
        .queryName("dstl_session_windows")
        .option("checkpointLocation", str(tmp_path / "dstl-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        dq.await_termination(300)
    finally:
        dq.stop()
    by_dstl = _window_rows(spark.table("dstl_session_windows").collect())
    # Spark may also run batches without data after the last file (the watermark moved):
    # they close later windows; both engines close the same windows up to the watermark
    # of the last batch with data (the largest event time before it, less the delay)
    last_watermark_ms = (
        max(s for batch in ex.CLICKS[:-1] for _, s in batch) * 1000
        - int(ex.DELAY.split()[0]) * 1000
    )
    closed = datetime.datetime.fromtimestamp(T0_S + last_watermark_ms / 1000)  # as collect()
    spark_closed = {r for r in _window_rows(by_spark) if r[1] <= closed}
    assert len(spark_closed) >= 2
    assert by_dstl == spark_closed
