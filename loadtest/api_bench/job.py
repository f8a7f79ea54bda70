"""The input, the job as five engines, and the loop that collects each batch's figures.

The job (issue 20's reference job, "count and sum per key"): input ``k long,
v long``; per key a count of its rows and a sum of ``v`` in state; in Update
mode one output row ``k, count, total`` per key of the batch.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkStatefulProcessor

from loadtest.api_bench.config import (
    CHANGELOG,
    ROCKSDB,
    SIDECAR_ENGINES,
    SPARK_STATE_ENGINES,
    BenchConfig,
)
from loadtest.api_bench.cpu import CpuSample
from loadtest.api_bench.figures import Batch, EngineRun, batch_of

INPUT_SCHEMA = "k long, v long"
OUTPUT_SCHEMA = "k long, count long, total long"
STATE_SCHEMA = "count long, total long"
#: dstl's key groups (the most state partitions a rescale may reach)
MAX_PARALLELISM = 16
#: seconds a dstl engine's batch waits for its figures in the progress before it is
#: recorded without them
FIGURES_WAIT_S = 5.0


class CountSum(SparkStatefulProcessor):  # type: ignore[misc,unused-ignore]
    """A count and a sum per key in value state; one output row per key and batch.

    Written against Spark's own base class: the same object runs on Spark's
    ``transformWithStateInPandas`` and on dstl's ``transform_with_state``.
    """

    def init(self, handle: Any) -> None:
        self.total = handle.getValueState("total", STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        n, s = self.total.get() if self.total.exists() else (0, 0)
        for pdf in rows:
            n += len(pdf)
            s += int(pdf["v"].sum())
        self.total.update((n, s))
        yield pd.DataFrame({"k": [key[0]], "count": [n], "total": [s]})

    def close(self) -> None:
        pass


def count_sum_group_state(key: Any, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """The same job for ``applyInPandasWithState`` (``GroupState``)."""
    import pandas as pd

    n, s = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        n += len(pdf)
        s += int(pdf["v"].sum())
    state.update((n, s))
    yield pd.DataFrame({"k": [key[0]], "count": [n], "total": [s]})


def write_input(directory: Path, cfg: BenchConfig) -> list[int]:
    """One Parquet file per batch; returns the distinct keys of each batch.

    Batch ``b`` has keys ``[b*new, (b+1)*new)`` once each (new state) and the
    rest of its rows on random keys seen so far (updates). The same seed gives
    the same files: every engine reads the same input.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    new = cfg.new_per_batch
    rng = np.random.default_rng(cfg.seed)
    directory.mkdir(parents=True, exist_ok=True)
    distinct: list[int] = []
    base = time.time() - 10_000
    for b in range(cfg.batches):
        fresh = np.arange(b * new, (b + 1) * new, dtype=np.int64)
        old = rng.integers(0, (b + 1) * new, cfg.rows - new, dtype=np.int64)
        ids = np.concatenate([fresh, old])
        rng.shuffle(ids)
        distinct.append(len(np.unique(ids)))
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(
            pa.table(
                {
                    "k": pa.array(ids, pa.int64()),
                    "v": pa.array(rng.integers(0, 1000, len(ids)), pa.int64()),
                }
            ),
            path,
        )
        os.utime(path, (base + b, base + b))  # the file source orders by modification time
    return distinct


def session(cfg: BenchConfig, engine: str) -> Any:
    """A local Spark session for one engine (Spark's state: RocksDB, changelog checkpointing)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{cfg.parallelism}]")
        .appName(f"dstl-api-bench-{engine}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cfg.parallelism))
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
        .config("spark.driver.memory", cfg.driver_memory)
    )
    if engine in SPARK_STATE_ENGINES:
        builder = builder.config("spark.sql.streaming.stateStore.providerClass", ROCKSDB).config(
            CHANGELOG, "true"
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _events(spark: Any, input_dir: Path) -> Any:
    return (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )


def _stateful(engine: str, spark: Any, input_dir: Path, work: Path, address: str) -> Any:
    """The job's stateful DataFrame (or dstl's writeStream-builder) on ``engine``."""
    grouped = _events(spark, input_dir).groupBy("k")
    parallelism = int(spark.conf.get("spark.sql.shuffle.partitions"))
    if engine == "tws":
        return grouped.transformWithStateInPandas(CountSum(), OUTPUT_SCHEMA, "Update", "None")
    if engine == "apply":
        return grouped.applyInPandasWithState(
            count_sum_group_state, OUTPUT_SCHEMA, STATE_SCHEMA, "Update", "NoTimeout"
        )
    if engine == "jvm":
        from pyspark.sql import functions as F

        return grouped.agg(F.count(F.lit(1)).alias("count"), F.sum("v").alias("total"))
    if engine == "dstl":
        from dstl_client.processor import transform_with_state

        return transform_with_state(
            grouped,
            processor=CountSum(),
            output_schema=OUTPUT_SCHEMA,
            output_mode="Update",
            time_mode="None",
            parallelism=parallelism,
            max_parallelism=MAX_PARALLELISM,
            dstl_address=address,
            state_dir=str(work / "state"),
        )
    if engine == "vec":
        try:
            # the vectorized engine (issue 20; branch h-vec): runs as soon as it imports
            from dstl_client.vectorized import transform_batches
            from loadtest.api_bench.vectorized_job import count_sum
        except ImportError as exc:
            raise EngineUnavailable(f"dstl_client.vectorized does not import yet: {exc}") from exc
        return transform_batches(
            grouped,
            key="k",
            fn=count_sum,
            state_schema=STATE_SCHEMA,
            output_schema=OUTPUT_SCHEMA,
            frame="arrow",
            parallelism=parallelism,
            max_parallelism=MAX_PARALLELISM,
            dstl_address=address,
            state_dir=str(work / "state"),
        )
    raise ValueError(f"unknown engine {engine!r}")


class EngineUnavailable(RuntimeError):
    """The engine's code is not there (the vectorized engine before it lands)."""


def _start(engine: str, spark: Any, input_dir: Path, work: Path, address: str, sink: Any) -> Any:
    out = _stateful(engine, spark, input_dir, work, address)
    return (
        out.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / "ckpt"))
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )


def _spark_query(q: Any) -> Any:
    """Spark's ``StreamingQuery`` behind ``q`` (dstl's queries wrap it as ``.query``)."""
    return getattr(q, "query", q)


def run_engine(
    engine: str,
    spark: Any,
    cfg: BenchConfig,
    input_dir: Path,
    work: Path,
    address: str,
    log: Callable[[str], None] = print,
    cpu: Callable[[], CpuSample] | None = None,
) -> EngineRun:
    """Run ``engine`` over every batch of ``input_dir``; its batches as they complete."""
    outputs: dict[int, int] = {}

    def sink(df: Any, batch_id: int) -> None:
        outputs[batch_id] = int(df.count())  # one action: runs the stateful operator once

    run = EngineRun(engine)
    seen: dict[int, Batch] = {}
    pending: dict[int, float] = {}

    def collect(progresses: list[dict[str, Any]], final: bool = False) -> None:
        for p in progresses:
            bid = int(p.get("batchId", -1))
            if bid < 0 or int(p.get("numInputRows", 0)) == 0 or bid in seen:
                continue
            first_seen = pending.setdefault(bid, time.perf_counter())
            waited = time.perf_counter() - first_seen
            if (
                engine in SIDECAR_ENGINES
                and not p.get("dstl")
                and waited < FIGURES_WAIT_S
                and not final
            ):
                continue  # its figures come a moment later (or never: then taken without)
            b = batch_of(p, engine, outputs.get(bid, -1))
            if cpu is not None:
                sample = cpu()
                b = replace(b, cpu_s=sample.total_s, jvm_cpu_s=sample.jvm_s, jit_cpu_s=sample.jit_s)
            seen[bid] = b
            log(
                f"{engine}: batch {bid + 1}/{cfg.batches}: {b.input_rows:,} rows, "
                f"{b.output_rows:,} out in {b.trigger_ms:,.0f} ms, checkpoint "
                f"{b.checkpoint_ms:,.0f} ms (state {b.state_commit_ms:,.0f} ms)"
            )

    t0 = time.perf_counter()
    try:
        q = _start(engine, spark, input_dir, work, address, sink)
    except EngineUnavailable as exc:
        run.error = str(exc)
        return run
    try:
        deadline = t0 + cfg.timeout_s
        spark_q = _spark_query(q)
        while spark_q is None or spark_q.isActive:
            if time.perf_counter() > deadline:
                run.error = f"stopped after {cfg.timeout_s:.0f}s"
                break
            collect(q.recentProgress)
            time.sleep(0.5)
            spark_q = _spark_query(q)
        run.wall_s = time.perf_counter() - t0
        if spark_q is not None and spark_q.exception() is not None:
            run.error = str(spark_q.exception())[:500]
        collect(q.recentProgress)
        collect(q.recentProgress, final=True)
    finally:
        q.stop()
    run.batches = [seen[b] for b in sorted(seen)]
    return run
