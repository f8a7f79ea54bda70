"""The input, the job as three engines, and each batch's figures from Spark's progress."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkStatefulProcessor

from loadtest.api_bench.config import ROCKSDB, BenchConfig

INPUT_SCHEMA = "k string, v long"
OUTPUT_SCHEMA = "k string, n long, s long"
STATE_SCHEMA = "n long, s long"


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
        yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s]})

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
    yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s]})


def write_input(directory: Path, cfg: BenchConfig) -> list[int]:
    """One Parquet file per batch; returns the distinct keys of each batch.

    Batch ``b`` has keys ``[b*new, (b+1)*new)`` once each (new state) and the
    rest of its rows on random keys seen so far (updates).
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
        fresh = np.arange(b * new, (b + 1) * new)
        old = rng.integers(0, (b + 1) * new, cfg.rows - new)
        ids = np.concatenate([fresh, old])
        rng.shuffle(ids)
        distinct.append(len(np.unique(ids)))
        keys = np.char.add("k", np.char.zfill(ids.astype(str), 8))
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(
            pa.table(
                {
                    "k": pa.array(keys.tolist(), pa.string()),
                    "v": pa.array(rng.integers(0, 1000, len(ids)), pa.int64()),
                }
            ),
            path,
        )
        os.utime(path, (base + b, base + b))  # the file source orders by modification time
    return distinct


def session(cfg: BenchConfig) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cfg.parallelism}]")
        .appName("dstl-api-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cfg.parallelism))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
        .config("spark.driver.memory", cfg.driver_memory)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@dataclass(frozen=True, slots=True)
class Batch:
    """One micro-batch of one engine, from Spark's progress. Frozen."""

    batch_id: int
    input_rows: int
    output_rows: int
    trigger_ms: float
    add_batch_ms: float
    #: offset and commit logs (``walCommit`` + ``commitOffsets``)
    log_ms: float
    #: the state's own checkpoint: the state store commit (Spark) or dstl's checkpoint
    state_commit_ms: float
    state_rows: int | None

    @property
    def checkpoint_ms(self) -> float:
        return self.log_ms + self.state_commit_ms


@dataclass(slots=True)
class EngineRun:
    """One engine's batches and how long it ran."""

    engine: str
    batches: list[Batch] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None


def batch_of(progress: dict[str, Any], engine: str, output_rows: int) -> Batch:
    d = progress.get("durationMs") or {}
    ops = progress.get("stateOperators") or []
    if engine == "dstl":
        fig = progress.get("dstl") or {}
        state_ms = float(fig.get("checkpointDurationMs", 0))
        state_rows = fig.get("stateRows")
    else:
        state_ms = float(sum(op.get("commitTimeMs", 0) for op in ops))
        state_rows = sum(int(op.get("numRowsTotal", 0)) for op in ops) if ops else None
    return Batch(
        batch_id=int(progress["batchId"]),
        input_rows=int(progress.get("numInputRows", 0)),
        output_rows=output_rows,
        trigger_ms=float(d.get("triggerExecution", 0)),
        add_batch_ms=float(d.get("addBatch", 0)),
        log_ms=float(d.get("walCommit", 0)) + float(d.get("commitOffsets", 0)),
        state_commit_ms=state_ms,
        state_rows=None if state_rows is None else int(state_rows),
    )


def _events(spark: Any, input_dir: Path) -> Any:
    return (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )


def _start(engine: str, spark: Any, input_dir: Path, work: Path, address: str, sink: Any) -> Any:
    grouped = _events(spark, input_dir).groupBy("k")
    if engine == "tws":
        out = grouped.transformWithStateInPandas(CountSum(), OUTPUT_SCHEMA, "Update", "None")
    elif engine == "apply":
        out = grouped.applyInPandasWithState(
            count_sum_group_state, OUTPUT_SCHEMA, STATE_SCHEMA, "Update", "NoTimeout"
        )
    else:
        from dstl_client.processor import transform_with_state

        out = transform_with_state(
            grouped,
            processor=CountSum(),
            output_schema=OUTPUT_SCHEMA,
            output_mode="Update",
            time_mode="None",
            parallelism=int(spark.conf.get("spark.sql.shuffle.partitions")),
            max_parallelism=16,
            dstl_address=address,
            state_dir=str(work / "state"),
        )
    return (
        out.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / "ckpt"))
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )


def run_engine(
    engine: str,
    spark: Any,
    cfg: BenchConfig,
    input_dir: Path,
    work: Path,
    address: str,
    log: Callable[[str], None] = print,
) -> EngineRun:
    """Run ``engine`` over every batch of ``input_dir``; its batches as they complete."""
    outputs: dict[int, int] = {}

    def sink(df: Any, batch_id: int) -> None:
        outputs[batch_id] = int(df.count())  # one action: runs the stateful operator once

    run = EngineRun(engine)
    seen: dict[int, Batch] = {}

    def collect(progresses: list[dict[str, Any]]) -> None:
        for p in progresses:
            bid = int(p.get("batchId", -1))
            if bid < 0 or int(p.get("numInputRows", 0)) == 0:
                continue
            if engine == "dstl" and not p.get("dstl"):
                continue  # its figures come a moment later
            if bid not in seen:
                b = batch_of(p, engine, outputs.get(bid, -1))
                seen[bid] = b
                log(
                    f"{engine}: batch {bid + 1}/{cfg.batches}: {b.input_rows:,} rows, "
                    f"{b.output_rows:,} out in {b.trigger_ms:,.0f} ms, checkpoint "
                    f"{b.checkpoint_ms:,.0f} ms (state {b.state_commit_ms:,.0f} ms)"
                )

    t0 = time.perf_counter()
    q = _start(engine, spark, input_dir, work, address, sink)
    try:
        deadline = t0 + cfg.timeout_s
        spark_q = q.query if engine == "dstl" else q
        while spark_q is None or spark_q.isActive:
            if time.perf_counter() > deadline:
                run.error = f"stopped after {cfg.timeout_s:.0f}s"
                break
            collect(q.recentProgress)
            time.sleep(0.5)
            spark_q = q.query if engine == "dstl" else q
        run.wall_s = time.perf_counter() - t0
        if spark_q is not None and spark_q.exception() is not None:
            run.error = str(spark_q.exception())[:500]
        collect(q.recentProgress)
    finally:
        q.stop()
    run.batches = [seen[b] for b in sorted(seen)]
    return run
