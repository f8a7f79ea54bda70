"""(c) The same job on Spark's RocksDB state store with changelog checkpointing.

A PySpark Structured Streaming query keeps the last value per key (``max`` of
the values, which name their round, so the newest wins): the same keys and
values as the dstl job, so the same state. Its input is one Parquet file per
round (round 0: every key; round ``r``: the keys :func:`update_ids` picks),
read one file per micro-batch (``maxFilesPerTrigger=1``) with
``trigger(availableNow=True)``; output to the ``noop`` sink; state in
``RocksDBStateStoreProvider`` with
``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled``,
every other state store setting at Spark's default (a snapshot every
``minDeltasForSnapshot`` = 10 versions, uploaded by the maintenance task).

Each *session* runs in its own Python process (its own JVM, ``local[p]``,
bound to 127.0.0.1, UI off): the first loads round 0; each later one is a
restart from the checkpoint, whose first micro-batch restores the state
(every partition's store loads its snapshot and replays its changelog files)
before it processes the next round. The figures of that first batch come
from Spark's progress: the state stores' load time
(``rocksdbLoadLatencyMs``, summed over partitions, and its snapshot and
changelog-replay parts), the number of changelog files replayed, the batch's
duration; and the time from ``start()`` to the first batch done.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.recovery_bench.config import BenchConfig
from loadtest.recovery_bench.workload import key_name, update_ids, value_of

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
#: a session may take this long
SESSION_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True)
class SparkRestore:
    """The first micro-batch after a restart. Frozen."""

    tail: int
    partitions: int
    #: start() to the first batch done, seconds
    restart_s: float
    #: the first batch's duration (triggerExecution), seconds
    first_batch_s: float
    #: the state stores' load time, summed over partitions, seconds
    load_sum_s: float
    load_snapshot_sum_s: float
    replay_sum_s: float
    replayed_files: int

    @property
    def load_s(self) -> float:
        """Load time per partition (they load in parallel, one task each)."""
        return self.load_sum_s / self.partitions


@dataclass(frozen=True, slots=True)
class SparkResult:
    """Every restart of the Spark job. Frozen."""

    partitions: int
    load_s: float
    restores: tuple[SparkRestore, ...]
    state_rows: int
    checkpoint_bytes: int
    #: median duration of a batch that restored nothing (an update round), seconds
    warm_batch_s: float | None


def write_round(directory: Path, cfg: BenchConfig, round_no: int, stamp: float) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = (
        range(cfg.keys)
        if round_no == 0
        else update_ids(cfg.keys, cfg.update_fraction, round_no, cfg.seed)
    )
    keys = [key_name(i) for i in ids]
    values = [value_of(i, round_no, cfg.value_bytes).decode() for i in ids]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"round-{round_no:05d}.parquet"
    tmp = directory.parent / f".{path.name}"
    pq.write_table(pa.table({"k": pa.array(keys), "v": pa.array(values)}), tmp)
    os.utime(tmp, (stamp, stamp))  # the file source orders files by modification time
    tmp.replace(path)
    return path


def run_spark(cfg: BenchConfig, work: Path, log: Callable[[str], None] = print) -> SparkResult:
    """Load, then restart after each tail in ``cfg.tails``; the restores' figures."""
    p = cfg.job_parallelism
    input_dir = work / "input"
    ckpt = work / "checkpoint"
    base = time.time() - 100_000
    t0 = time.perf_counter()
    write_round(input_dir, cfg, 0, base)
    first = _session(cfg, work, input_dir, ckpt, "load")
    load_s = first["first_batch_s"]
    log(f"spark: {cfg.keys:,} keys loaded ({time.perf_counter() - t0:.1f}s with the JVM)")
    restores = []
    warm: list[float] = []
    done = 0
    for tail in sorted(set(cfg.tails)):
        # the rounds up to this tail, then a restart whose first batch is round tail + 1
        for r in range(done + 1, tail + 1):
            write_round(input_dir, cfg, r, base + r)
        if tail > done:
            doc = _session(cfg, work, input_dir, ckpt, f"rounds {done + 1}..{tail}")
            warm += doc["later_batches_s"]
        write_round(input_dir, cfg, tail + 1, base + tail + 1)
        doc = _session(cfg, work, input_dir, ckpt, f"restart after {tail}")
        done = tail + 1
        metrics = doc["metrics"]
        restores.append(
            SparkRestore(
                tail=tail,
                partitions=p,
                restart_s=doc["restart_s"],
                first_batch_s=doc["first_batch_s"],
                load_sum_s=metrics.get("rocksdbLoadLatencyMs", 0) / 1000,
                load_snapshot_sum_s=metrics.get("rocksdbLoadFromSnapshotLatencyMs", 0) / 1000,
                replay_sum_s=metrics.get("rocksdbReplayChangeLogLatencyMs", 0) / 1000,
                replayed_files=int(metrics.get("rocksdbNumReplayChangelogFiles", 0)),
            )
        )
        last = restores[-1]
        log(
            f"spark: restart after {tail} updates: first batch {last.first_batch_s:.2f}s, "
            f"state load {last.load_s:.2f}s per partition ({last.replayed_files} changelog "
            f"files replayed), start to first batch done {last.restart_s:.2f}s"
        )
    size = sum(f.stat().st_size for f in (ckpt / "state").rglob("*") if f.is_file())
    return SparkResult(
        p,
        load_s,
        tuple(restores),
        int(first["state_rows"]),
        size,
        statistics.median(warm) if warm else None,
    )


def _session(
    cfg: BenchConfig,
    work: Path,
    input_dir: Path,
    ckpt: Path,
    name: str,
) -> dict[str, Any]:
    """Run one session in its own process (and JVM); its figures."""
    args = {
        "parallelism": cfg.job_parallelism,
        "driver_memory": cfg.driver_memory,
        "input": str(input_dir),
        "checkpoint": str(ckpt),
    }
    log_path = work / f"spark-{name.replace(' ', '-').replace('.', '')}.log"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    with log_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadtest.recovery_bench.spark_job", json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            start_new_session=True,  # the JVM is in its group: killed with it on failure
        )
        try:
            out, _ = proc.communicate(timeout=SESSION_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"spark session {name!r} failed (exit {proc.returncode}): "
            f"{log_path.read_text()[-3000:]}"
        )
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


def _iso_to_unix(ts: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _session_main(args: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    p = int(args["parallelism"])
    spark = (
        SparkSession.builder.master(f"local[{p}]")
        .appName("dstl-recovery-bench")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(p))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        .config(CHANGELOG, "true")
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
        .config("spark.driver.memory", str(args["driver_memory"]))
        .getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        src = (
            spark.readStream.schema("k string, v string")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(args["input"]))
        )
        agg = src.groupBy("k").agg(F.max("v").alias("v"))
        t0 = time.time()
        q = (
            agg.writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(args["checkpoint"]))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(int(SESSION_TIMEOUT_S))
        if q.isActive:
            q.stop()
            raise RuntimeError("the query did not finish")
        if q.exception() is not None:
            raise RuntimeError(f"the query failed: {q.exception()}")
        progress = [pr for pr in q.recentProgress if pr.numInputRows > 0]
        if not progress:
            raise RuntimeError("the query processed no batch")
        first = progress[0]
        trig = first.durationMs.get("triggerExecution", 0) / 1000
        ops = first.stateOperators
        metrics = dict(ops[0].customMetrics) if ops else {}
        doc = {
            "batches": len(progress),
            "restart_s": _iso_to_unix(first.timestamp) + trig - t0,
            "first_batch_s": trig,
            "metrics": metrics,
            "later_batches_s": [
                pr.durationMs.get("triggerExecution", 0) / 1000 for pr in progress[1:]
            ],
            "state_rows": progress[-1].stateOperators[0].numRowsTotal if ops else 0,
        }
        print(json.dumps(doc), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    _session_main(json.loads(sys.argv[1]))
