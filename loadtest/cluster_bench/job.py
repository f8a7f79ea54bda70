"""The keyed job of the multi-node test, as one driver process on a standalone cluster.

Run by ``tests/e2e/test_cluster.py`` and the cluster benchmark::

    python -m loadtest.cluster_bench.job --master spark://127.0.0.1:7077 --address ... \\
        --checkpoint-dir ... --input-dir ... --out-dir ... (--until-batch 7 | --until-files 8) \\
        [--crash phase:batch] [--jvm-options="-XX:TieredStopAtLevel=1 ..."]

The executors find their own node's sidecar and state directory in their
environment (the cluster's workers set ``DSTL_ADDRESS``/``DSTL_STATE_DIR``);
``--address`` is the sidecar of the driver's node, used by the driver alone.
``--jvm-options`` (default: none) go to the driver's JVM and the executors'
(``spark.driver.extraJavaOptions``, ``spark.executor.extraJavaOptions``): the
tests start the cluster's JVMs with light options, the benchmark with the
JVM's defaults.
The user function is defined here, in ``__main__``, so it travels to the
executors by value (they cannot import the tests package).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dstl_client.state import INT64, TupleSerializer
from loadtest.spark_offsets import run_until_all_input

SUM: TupleSerializer[Any] = TupleSerializer(INT64, INT64)
OUTPUT_SCHEMA = "k string, count long, total long"
MAX_P = 16


def output_sink(out_dir: Path) -> Any:
    """An idempotent sink: each batch's output replaces that batch's directory."""

    def sink(df: Any, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(str(out_dir / f"batch={batch_id}"))

    return sink


def count_and_sum(key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
    """Running count and sum of ``v`` per key; one output row per key and batch."""
    state = ctx.value_state("agg", SUM)
    count, total = state.value() or (0, 0)
    for r in rows:
        count += 1
        total += r["v"]
    state.update((count, total))
    yield key, count, total


def session(master: str, executors: int, jvm_options: str = "") -> Any:
    """The driver's Spark session on the cluster at ``master`` (``jvm_options``: see the
    module docstring)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if jvm_options:
        builder = builder.config("spark.driver.extraJavaOptions", jvm_options).config(
            "spark.executor.extraJavaOptions", jvm_options
        )
    spark = (
        builder.master(master)
        .appName("dstl-cluster-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "768m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(executors))
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.task.maxFailures", "8")
        # a lost node's tasks go elsewhere at once; no waiting for locality
        .config("spark.locality.wait", "0s")
        # a Python task still running after a minute prints its threads' stacks to
        # the executor's stderr (what a hung test shows in its diagnostics)
        .config("spark.python.worker.tracebackDumpIntervalSeconds", "60")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("master", "address", "checkpoint-dir", "input-dir", "out-dir"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--metadata-url", default="")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--parallelism", type=int, default=4)
    until = p.add_mutually_exclusive_group(required=True)
    until.add_argument("--until-batch", type=int, help="stop once this batch is recorded")
    until.add_argument(
        "--until-files",
        type=int,
        help="stop once Spark committed this many input files and dstl recorded that batch"
        " (the batch ids can shift: see loadtest.spark_offsets)",
    )
    p.add_argument("--crash", default="", help="phase:batch -> SIGKILL the driver there")
    p.add_argument("--jvm-options", default="", help="the driver's and executors' JVMs")
    p.add_argument("--phases-file", default="", help="append 'phase batch unix_time' lines")
    p.add_argument(
        "--timeout-s",
        type=float,
        default=400.0,
        help="wait at most this for --until-batch/--until-files",
    )
    args = p.parse_args()
    from dstl_client.spark import process_keyed

    crash_phase, _, crash_batch = args.crash.partition(":")

    phases = open(args.phases_file, "a", buffering=1) if args.phases_file else None  # noqa: SIM115

    # the driver's log tells where a run stands: dstl's per-batch lines, each phase,
    # and the driver's thread stacks shortly before the job gives up
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("dstl_client").setLevel(logging.INFO)
    faulthandler.dump_traceback_later(max(1.0, args.timeout_s - 5.0))

    def on_phase(phase: str, batch_id: int) -> None:
        print(f"{time.strftime('%H:%M:%S')} phase {phase} {batch_id}", flush=True)
        if phases is not None:
            phases.write(f"{phase} {batch_id} {time.time():.6f}\n")
        if phase == crash_phase and batch_id == int(crash_batch):
            print(f"crashing at {phase} of batch {batch_id}", flush=True)
            os.killpg(os.getpgid(0), signal.SIGKILL)

    spark = session(args.master, args.executors, args.jvm_options)
    df = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(args.input_dir)
    )
    extra: dict[str, Any] = {"metadata_url": args.metadata_url} if args.metadata_url else {}
    q = process_keyed(
        df,
        key="k",
        fn=count_and_sum,
        output_schema=OUTPUT_SCHEMA,
        parallelism=args.parallelism,
        max_parallelism=MAX_P,
        checkpoint_dir=args.checkpoint_dir,
        job_id="e2e-cluster",
        dstl_address=args.address,
        orphan_grace_s=0,
        materialize_interval_s=2,
        # a batch stuck on the cluster (a task that never returns) is aborted and run
        # again well within the test's wait, and the driver's log says so
        checkpoint_timeout_s=150,
        sink=output_sink(Path(args.out_dir)),
        on_phase=on_phase,
        **extra,
    )
    try:
        if args.until_files is None:
            q.wait_for_batch(args.until_batch, timeout_s=args.timeout_s)
        else:
            run_until_all_input(q, args.checkpoint_dir, args.until_files, args.timeout_s)
    finally:
        q.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
