"""One processor on both engines: Spark's own ``transformWithStateInPandas`` /
``transformWithState`` (RocksDB state store) and dstl's ``transform_with_state``.

:func:`run_both` writes the input (one Parquet file per micro-batch, all of
them before either query starts: a backlog, so Spark runs no batch without
data in between), runs the same processor class on both engines with
``availableNow`` and returns each engine's output rows per batch, sorted, for
the caller to compare. Share one Spark session (the module's ``spark``
fixture) and one sidecar across many runs; each run costs two short queries.

Thread: the test's thread; the queries run on Spark's threads.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: output rows per batch id
Rows = dict[int, list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Case:
    """What both engines run: the input, the operator's arguments and the session's settings."""

    #: the input's schema (DDL) and its rows per micro-batch (tuples in the schema's order)
    input_schema: str
    batches: list[list[tuple[Any, ...]]]
    key: str
    output_schema: str
    time_mode: str = "None"
    #: ``(column, delay)``: ``withWatermark`` on the input (event time)
    watermark: tuple[str, str] | None = None
    use_pandas: bool = True
    #: the initial state: its schema (DDL, with the key column) and rows
    initial: tuple[str, list[tuple[Any, ...]]] | None = None
    #: Spark SQL settings for both queries (restored afterwards)
    conf: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def session_conf(spark: Any, conf: dict[str, str]) -> Iterator[None]:
    """``conf`` set on ``spark`` for the block, the old values back afterwards."""
    old = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def write_batches(spark: Any, directory: Path, case: Case) -> None:
    """One Parquet file per batch, oldest first (the file source reads them in that order)."""
    directory.mkdir(parents=True)
    base = time.time() - 1000
    for b, rows in enumerate(case.batches):
        staging = directory.parent / f"staging-{b}"
        spark.createDataFrame(rows, case.input_schema).coalesce(1).write.parquet(str(staging))
        (part,) = staging.glob("part-*.parquet")
        path = directory / f"part-{b:05d}.parquet"
        part.rename(path)
        os.utime(path, (base + b, base + b))


def _collector(into: Rows) -> Callable[[Any, int], None]:
    def sink(df: Any, batch_id: int) -> None:
        into[batch_id] = sorted((tuple(r) for r in df.collect()), key=repr)

    return sink


def run_both(
    spark: Any,
    sidecar_address: str,
    tmp: Path,
    make_processor: Callable[[], Any],
    case: Case,
    *,
    timeout_s: float = 240,
) -> tuple[Rows, Rows]:
    """``(spark_rows, dstl_rows)``: the output per batch of each engine on ``case``."""
    from dstl_client.processor import transform_with_state

    write_batches(spark, tmp / "input", case)
    with session_conf(
        spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB, **case.conf}
    ):

        def events() -> Any:
            df = (
                spark.readStream.schema(case.input_schema)
                .option("maxFilesPerTrigger", 1)
                .parquet(str(tmp / "input"))
            )
            return df

        initial = None
        if case.initial is not None:
            schema, rows = case.initial
            initial = spark.createDataFrame(rows, schema).groupBy(case.key)
        by_spark: Rows = {}
        grouped = events()
        if case.watermark is not None:
            grouped = grouped.withWatermark(*case.watermark)
        grouped = grouped.groupBy(case.key)
        operator = (
            grouped.transformWithStateInPandas if case.use_pandas else grouped.transformWithState
        )
        q = (
            operator(
                make_processor(),
                case.output_schema,
                "Update",
                case.time_mode,
                initialState=initial,
            )
            .writeStream.foreachBatch(_collector(by_spark))
            .option("checkpointLocation", str(tmp / "spark-ckpt"))
            .outputMode("update")
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination(timeout_s)
        finally:
            q.stop()
        by_dstl: Rows = {}
        event_time: dict[str, Any] = {}
        if case.watermark is not None:
            event_time = {
                "event_time_column": case.watermark[0],
                "watermark_delay": case.watermark[1],
            }
        dq = (
            transform_with_state(
                events().groupBy(case.key),
                processor=make_processor(),
                output_schema=case.output_schema,
                output_mode="Update",
                time_mode=case.time_mode,
                use_pandas=case.use_pandas,
                initial_state=initial,
                parallelism=2,
                max_parallelism=16,
                dstl_address=sidecar_address,
                state_dir=str(tmp / "state"),
                **event_time,
            )
            .writeStream.foreachBatch(_collector(by_dstl))
            .option("checkpointLocation", str(tmp / "dstl-ckpt"))
            .outputMode("update")
            .trigger(availableNow=True)
            .start()
        )
        try:
            dq.await_termination(timeout_s)
        finally:
            dq.stop()
    return by_spark, by_dstl


def data_batches(rows: Rows, n: int) -> Rows:
    """The output of the first ``n`` batches (those with input: Spark may add a batch
    without data at the end of an ``availableNow`` run, to move the watermark)."""
    return {b: r for b, r in rows.items() if b < n}
