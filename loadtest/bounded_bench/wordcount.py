"""(b) WordCount in a global window as PySpark jobs: sorted mode vs the keyed backend.

The same keyed function (:func:`word_count`: a ``ValueState`` count per word,
one output row per word with its total) over the same Parquet input:

* ``sorted``: ``process_bounded`` on ``spark.read.parquet`` (repartition by
  word, sort within partitions, one key at a time on the single-key
  backend), output written with ``df.write.parquet``;
* ``keyed``: ``process_keyed`` on ``spark.readStream.parquet`` with
  ``trigger(availableNow=True)``, so the whole input is one micro-batch;
  state in the node-local SQLite stores, every change logged to a real
  ``dstl-server`` on loopback (``file://`` storage) and persisted, a
  checkpoint record written; output written by the batch's sink.

Each job is timed from the call to the last output file written, in wall time
and in CPU time (this process and every descendant: the JVM, the Python
workers, the sidecar; less sensitive to other load on the machine than wall
time); both outputs are checked against a NumPy count of the input. The
sidecar and the Spark session start before the clock; a small warm-up run of
each mode first.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstl_client.state.api import KeyedContext
from dstl_client.state.serializers import INT64
from loadtest.bounded_bench.config import BenchConfig

OUTPUT_SCHEMA = "word string, n long"
MODES = ("sorted", "keyed")


def word_count(key: Any, rows: list[dict[str, Any]], ctx: KeyedContext) -> Iterator[Any]:
    """The count of ``key`` over the global window; its total is the output."""
    count = ctx.value_state("count", INT64)
    n = (count.value() or 0) + len(rows)
    count.update(n)
    yield key, n


def write_input(directory: Path, records: int, keys: int, files: int, seed: int = 7) -> Any:
    """``records`` words (``w0000000``...), every one of ``keys`` at least once, shuffled;
    as ``files`` Parquet files. Returns the count per word id (NumPy)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if keys > records:
        raise ValueError("more distinct keys than records")
    rng = np.random.default_rng(seed)
    ids = np.concatenate([np.arange(keys), rng.integers(0, keys, records - keys)])
    rng.shuffle(ids)
    directory.mkdir(parents=True, exist_ok=True)
    words = np.char.add("w", np.char.zfill(ids.astype(str), 7))
    for i, chunk in enumerate(np.array_split(words, files)):
        pq.write_table(
            pa.table({"word": pa.array(chunk.tolist(), pa.string())}),
            directory / f"part-{i:03d}.parquet",
        )
    return np.bincount(ids, minlength=keys)


def read_output(directory: Path) -> dict[str, int]:
    import pyarrow.parquet as pq

    table = pq.read_table(directory)
    return dict(zip(table.column("word").to_pylist(), table.column("n").to_pylist(), strict=True))


def check_output(got: dict[str, int], counts: Any) -> str | None:
    """``None`` if ``got`` is the count of every word, else what differs."""
    if len(got) != len(counts):
        return f"{len(got)} words in the output, {len(counts)} in the input"
    for i, n in enumerate(counts.tolist()):
        word = f"w{i:07d}"
        if got.get(word) != n:
            return f"{word}: {got.get(word)} instead of {n}"
    return None


def session(cfg: BenchConfig) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cfg.parallelism}]")
        .appName("dstl-bounded-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cfg.parallelism))
        .config("spark.driver.memory", cfg.driver_memory)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def tree_cpu_s() -> float:
    """CPU seconds of this process and its descendants (reaped ones included)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # gone meanwhile: its time is in its parent's children_*
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run_sorted(spark: Any, cfg: BenchConfig, input_dir: Path, out_dir: Path) -> float:
    """Seconds of the sorted-mode job."""
    from dstl_client.bounded import process_bounded

    t0 = time.perf_counter()
    out = process_bounded(
        spark.read.parquet(str(input_dir)),
        key="word",
        fn=word_count,
        output_schema=OUTPUT_SCHEMA,
        parallelism=cfg.parallelism,
    )
    out.write.mode("overwrite").parquet(str(out_dir))
    return time.perf_counter() - t0


@dataclass(frozen=True, slots=True)
class KeyedFigures:
    """What the keyed job's checkpoint reported. Frozen."""

    changes: int
    logged_bytes: int
    persisted_bytes: int
    state_bytes: int
    apply_max_s: float
    persist_max_s: float
    task_max_s: float


def run_keyed(
    spark: Any, cfg: BenchConfig, input_dir: Path, out_dir: Path, work: Path, address: str
) -> tuple[float, KeyedFigures]:
    """Seconds of the keyed-backend job (one availableNow batch) and its checkpoint's figures."""
    from dstl_client.spark import process_keyed

    def sink(df: Any, batch_id: int) -> None:
        df.write.mode("append").parquet(str(out_dir))

    schema = spark.read.parquet(str(input_dir)).schema  # untimed: the file's schema
    t0 = time.perf_counter()
    q = process_keyed(
        spark.readStream.schema(schema).parquet(str(input_dir)),
        key="word",
        fn=word_count,
        output_schema=OUTPUT_SCHEMA,
        parallelism=cfg.parallelism,
        checkpoint_dir=str(work / "ckpt"),
        job_id=f"bounded-bench-{work.name}",
        dstl_address=address,
        state_dir=str(work / "state"),
        trigger={"availableNow": True},
        sink=sink,
    )
    try:
        q.await_termination()
        seconds = time.perf_counter() - t0
        if q.query is not None and q.query.exception() is not None:
            raise RuntimeError(f"the keyed query failed: {q.query.exception()}")
    finally:
        q.stop()
    history = q.history
    if len(history) != 1:
        raise RuntimeError(f"the keyed job ran {len(history)} batches, not one")
    h = history[0]
    return seconds, KeyedFigures(
        changes=h.changes,
        logged_bytes=h.logged_bytes,
        persisted_bytes=h.persisted_bytes,
        state_bytes=h.state_bytes,
        apply_max_s=h.apply_max_s,
        persist_max_s=h.persist_max_s,
        task_max_s=h.task_max_s,
    )


@dataclass(frozen=True, slots=True)
class JobResult:
    """Both jobs' times (every timed run) and checks. Frozen."""

    records: int
    keys: int
    seconds: dict[str, list[float]]
    #: CPU seconds of each run (driver, JVM, Python workers, sidecar)
    cpu: dict[str, list[float]]
    errors: dict[str, str | None]
    keyed: KeyedFigures
    input_bytes: int

    def best(self, mode: str) -> float:
        return min(self.seconds[mode])

    @property
    def speedup(self) -> float:
        return self.best("keyed") / self.best("sorted")

    @property
    def cpu_ratio(self) -> float:
        return min(self.cpu["keyed"]) / min(self.cpu["sorted"])


def run_job(cfg: BenchConfig, work: Path, log: Callable[[str], None] = print) -> JobResult:
    from dstl_server.testing import ServerProcess

    t0 = time.perf_counter()
    counts = write_input(work / "input", cfg.records, cfg.keys, cfg.files)
    input_bytes = sum(p.stat().st_size for p in (work / "input").iterdir())
    log(
        f"job: {cfg.records:,} records, {cfg.keys:,} words written "
        f"({input_bytes / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f}s"
    )
    warm_counts = None
    if cfg.warmup_records:
        warm_keys = max(1, min(cfg.keys, cfg.warmup_records // 10))
        warm_counts = write_input(work / "warm-input", cfg.warmup_records, warm_keys, 2)
    spark = session(cfg)
    try:
        with ServerProcess(work / "sidecar") as sidecar:
            if warm_counts is not None:
                s = run_sorted(spark, cfg, work / "warm-input", work / "warm-sorted")
                k, _ = run_keyed(
                    spark,
                    cfg,
                    work / "warm-input",
                    work / "warm-keyed",
                    work / "warm",
                    sidecar.address,
                )
                log(
                    f"job: warm-up ({cfg.warmup_records:,} records): sorted {s:.1f}s, keyed {k:.1f}s"
                )
            seconds: dict[str, list[float]] = {m: [] for m in MODES}
            cpu: dict[str, list[float]] = {m: [] for m in MODES}
            errors: dict[str, str | None] = {}
            figures: KeyedFigures | None = None
            for r in range(cfg.repeat):
                out = work / f"out-sorted-{r}"
                c0 = tree_cpu_s()
                seconds["sorted"].append(run_sorted(spark, cfg, work / "input", out))
                cpu["sorted"].append(tree_cpu_s() - c0)
                errors["sorted"] = errors.get("sorted") or check_output(read_output(out), counts)
                shutil.rmtree(out, ignore_errors=True)
                log(
                    f"job: sorted run {r + 1}: {seconds['sorted'][-1]:.1f}s, "
                    f"CPU {cpu['sorted'][-1]:.1f}s"
                )
                out = work / f"out-keyed-{r}"
                c0 = tree_cpu_s()
                s, figures = run_keyed(
                    spark, cfg, work / "input", out, work / f"keyed-{r}", sidecar.address
                )
                cpu["keyed"].append(tree_cpu_s() - c0)
                seconds["keyed"].append(s)
                errors["keyed"] = errors.get("keyed") or check_output(read_output(out), counts)
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(work / f"keyed-{r}", ignore_errors=True)
                log(f"job: keyed run {r + 1}: {s:.1f}s, CPU {cpu['keyed'][-1]:.1f}s")
    finally:
        spark.stop()
    assert figures is not None
    return JobResult(cfg.records, cfg.keys, seconds, cpu, errors, figures, input_bytes)
