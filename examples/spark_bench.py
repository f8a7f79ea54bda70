"""Checkpoint cost of keyed state as it grows: DSTL changelog vs full snapshots vs Spark RocksDB.

One run, one Spark session (local mode), one ``dstl-server`` on ``file://``,
the same stateful aggregation (a count per key) over the same generated
stream (``rate-micro-batch``: ``--rows-per-batch`` rows per batch, keys
``pmod(value * 2654435761, --keys)``, so the first ``keys / rows`` batches
insert new keys and later ones update them):

(a) ``changelog``: ``process_keyed`` with the changelog backend; materialization
    every ``--materialize-interval`` seconds;
(b) ``full``: the same backend taking a full snapshot of the state at every
    batch (the baseline a checkpoint without a changelog pays);
(c) ``rocksdb``: Spark's own ``groupBy().count()`` with the RocksDB state store
    and changelog checkpointing.

Per batch it records the checkpoint time (a: slowest task's persist + the
record; b: the same + the snapshot; c: the state store's ``commitTimeMs``
summed over partitions, as Spark reports it) and bytes written (a: changelog
bytes; b: snapshot + changelog; c: bytes of new files in the state checkpoint
directory), against the state size. Prints median / p90 / max per mode, for
the batches after ``--warmup``, writes every figure to ``results.json`` and
draws checkpoint time against state size per mode next to it
(``checkpoint-vs-state.png``, or ``--plot PATH``; needs matplotlib, the
``bench`` extra). ``--replot results.json`` draws the PNG again from a
finished run's figures without running anything.

    .venv/bin/python examples/spark_bench.py --rows-per-batch 100000 --keys 1000000 --batches 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: how each mode is named in the plot's legend
MODE_LABELS = {
    "changelog": "dstl changelog",
    "full": "dstl full snapshot every batch",
    "rocksdb": "Spark RocksDB + changelog checkpointing",
}


def count_fn(key: Any, rows: list[dict[str, Any]], ctx: Any) -> None:
    from dstl_client.state.serializers import INT64

    state = ctx.value_state("count", INT64)
    state.update((state.value() or 0) + len(rows))


def _source(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", args.rows_per_batch)
        .option("numPartitions", args.parallelism)
        .option("startTimestamp", 0)
        .load()
        .select(F.concat(F.lit("k"), F.expr(f"pmod(value * 2654435761, {args.keys})")).alias("k"))
    )


def _dir_bytes(path: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in path.rglob("*") if p.is_file()}


def run_dstl(
    spark: Any, args: argparse.Namespace, work: Path, address: str, full: bool
) -> list[dict[str, Any]]:
    from dstl_client.spark import process_keyed

    name = "full" if full else "changelog"
    q = process_keyed(
        _source(spark, args),
        key="k",
        fn=count_fn,
        parallelism=args.parallelism,
        max_parallelism=args.max_parallelism,
        checkpoint_dir=str(work / name),
        job_id=f"bench-{name}",
        dstl_address=address,
        state_dir=str(work / f"state-{name}"),
        materialize_interval_s=0.0 if full else args.materialize_interval,
        # the baseline pays its snapshot inside every batch; the changelog's
        # materialization runs in the background, across batches
        materialization_wait_s=3600.0 if full else 0.0,
        full_snapshot=full,
    )
    try:
        q.wait_for_batch(args.batches - 1, timeout_s=3600)
    finally:
        q.stop()
    out = []
    for h in q.history[: args.batches]:
        cp_s = h.checkpoint_s + (h.mat_max_s if full else 0.0)
        cp_bytes = h.persisted_bytes + (h.mat_bytes if full else 0)
        out.append(
            {
                "batch": h.batch_id,
                "checkpoint_ms": round(cp_s * 1000, 1),
                "checkpoint_bytes": cp_bytes,
                "state_bytes": h.state_bytes,
                "batch_ms": round((h.batch_s or 0.0) * 1000, 1),
                "materialized": h.materialized,
                "mat_ms": round(h.mat_max_s * 1000, 1),
                "mat_bytes": h.mat_bytes,
            }
        )
        mat = (
            f", materialized {h.mat_bytes / 1e6:.1f} MB in {h.mat_max_s * 1000:.0f} ms"
            if h.materialized and not full
            else ""
        )
        print(
            f"  {name} batch {h.batch_id}: checkpoint {out[-1]['checkpoint_ms']} ms "
            f"{cp_bytes / 1e6:.2f} MB, state {h.state_bytes / 1e6:.1f} MB, "
            f"batch {out[-1]['batch_ms']} ms{mat}",
            flush=True,
        )
    return out


def run_rocksdb(spark: Any, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    ckpt = work / "rocksdb"
    q = (
        _source(spark, args)
        .groupBy("k")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(ckpt))
        .start()
    )
    out = []
    seen_files: dict[str, int] = {}
    last = -1
    try:
        while last < args.batches - 1:
            p = q.lastProgress
            if p is None or p["batchId"] == last:
                if not q.isActive:
                    raise RuntimeError(f"rocksdb query stopped: {q.exception()}")
                time.sleep(0.05)
                continue
            last = p["batchId"]
            files = _dir_bytes(ckpt / "state")
            new_bytes = sum(size for f, size in files.items() if seen_files.get(f) != size)
            seen_files = files
            op = p["stateOperators"][0]
            custom = op.get("customMetrics", {})
            out.append(
                {
                    "batch": last,
                    "checkpoint_ms": float(op["commitTimeMs"]),
                    "checkpoint_bytes": new_bytes,
                    "state_bytes": int(custom.get("rocksdbSstFileSize", 0))
                    + int(op.get("memoryUsedBytes", 0)),
                    "state_rows": op["numRowsTotal"],
                    "batch_ms": float(p["durationMs"].get("triggerExecution", 0)),
                }
            )
            print(
                f"  rocksdb batch {last}: commit {op['commitTimeMs']} ms {new_bytes / 1e6:.2f} MB, "
                f"rows {op['numRowsTotal']}, batch {out[-1]['batch_ms']} ms",
                flush=True,
            )
    finally:
        q.stop()
    return out


def _stats(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    if not s:
        return {"median": 0.0, "p90": 0.0, "max": 0.0}
    return {
        "median": round(statistics.median(s), 1),
        "p90": round(s[min(len(s) - 1, int(0.9 * len(s)))], 1),
        "max": round(s[-1], 1),
    }


def plot_results(results: dict[str, Any], path: Path) -> Path:
    """Checkpoint ms (log) against state MB of every batch, one line per mode.

    Raises ``loadtest.plots.PlotInputError`` when ``results`` has no batch to
    draw and ``PlotUnavailable`` without matplotlib.
    """
    # the benchmarks run from the checkout: loadtest is beside examples/, not installed
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from loadtest.plots import Series, draw_checkpoint_vs_state

    series = [
        Series(
            MODE_LABELS.get(mode, mode),
            tuple(b["state_bytes"] / 1e6 for b in r["batches"]),
            tuple(float(b["checkpoint_ms"]) for b in r["batches"]),
        )
        for mode, r in results.get("modes", {}).items()
        if r.get("batches")
    ]
    a = results.get("args", {})
    load = results.get("load_avg")
    title = (
        f"{a.get('rows_per_batch', 0):,} rows per batch into {a.get('keys', 0):,} keys, "
        f"parallelism {a.get('parallelism', '?')}, {a.get('batches', '?')} batches"
        + (
            f"; load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} CPUs"
            if load
            else ""
        )
    )
    # dstl: its store's bytes; RocksDB: SST files + memory in use (Spark's metrics)
    return draw_checkpoint_vs_state(
        series, path, title, xlabel="state size (MB, as each backend reports it)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows-per-batch", type=int, default=100_000)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2, help="batches left out of the summary")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--max-parallelism", type=int, default=128)
    p.add_argument("--materialize-interval", type=float, default=20.0)
    p.add_argument("--modes", default="changelog,full,rocksdb")
    p.add_argument("--workdir", default="")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="where to draw the PNG (default: checkpoint-vs-state.png beside results.json)",
    )
    p.add_argument(
        "--replot",
        type=Path,
        default=None,
        metavar="RESULTS_JSON",
        help="only draw the PNG from a finished run's results.json",
    )
    args = p.parse_args(argv)
    if args.replot is not None:
        png = args.plot or args.replot.with_name("checkpoint-vs-state.png")
        print(f"plot: {plot_results(json.loads(args.replot.read_text()), png)}")
        return 0
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from dstl_server.testing import ServerProcess

    work = Path(args.workdir or tempfile.mkdtemp(prefix="dstl-spark-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    spark = (
        SparkSession.builder.master(f"local[{args.parallelism}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.parallelism))
        .config("spark.driver.memory", "3g")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    args_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    results: dict[str, Any] = {"args": args_json, "modes": {}}
    load_start = os.getloadavg()[0]
    try:
        with ServerProcess(work / "sidecar") as sidecar:
            for mode in args.modes.split(","):
                print(f"== {mode}", flush=True)
                started = time.monotonic()
                if mode == "rocksdb":
                    rows = run_rocksdb(spark, args, work)
                else:
                    rows = run_dstl(spark, args, work, sidecar.address, full=(mode == "full"))
                results["modes"][mode] = {
                    "batches": rows,
                    "wall_s": round(time.monotonic() - started, 1),
                }
    finally:
        spark.stop()
    print(
        f"\nper-batch checkpoint, batches >= {args.warmup} "
        f"({args.rows_per_batch} rows/batch, {args.keys} keys, parallelism {args.parallelism}):"
    )
    print(
        f"{'mode':10s} {'checkpoint ms med/p90/max':>26s} {'MB med/p90/max':>22s} "
        f"{'state MB first->last':>22s} {'batch ms med/p90/max':>24s}"
    )
    for mode, r in results["modes"].items():
        rows = [b for b in r["batches"] if b["batch"] >= args.warmup]
        t = _stats([b["checkpoint_ms"] for b in rows])
        m = _stats([b["checkpoint_bytes"] / 1e6 for b in rows])
        bt = _stats([b["batch_ms"] for b in rows])
        r["summary"] = {"checkpoint_ms": t, "checkpoint_mb": m, "batch_ms": bt}
        s0 = rows[0]["state_bytes"] / 1e6 if rows else 0
        s1 = rows[-1]["state_bytes"] / 1e6 if rows else 0
        print(
            f"{mode:10s} {t['median']:8.1f} /{t['p90']:7.1f} /{t['max']:7.1f} "
            f"{m['median']:8.2f} /{m['p90']:6.2f} /{m['max']:6.2f}   {s0:8.1f} -> {s1:7.1f}"
            f"   {bt['median']:7.0f} /{bt['p90']:6.0f} /{bt['max']:6.0f}"
        )
    mats = [
        b for b in results["modes"].get("changelog", {}).get("batches", []) if b.get("materialized")
    ]
    if mats:
        print(
            "changelog materializations (in the background of a batch): "
            + ", ".join(f"{b['mat_bytes'] / 1e6:.1f} MB in {b['mat_ms']:.0f} ms" for b in mats)
        )
    results["load_avg"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nfigures: {work / 'results.json'}")
    png = args.plot or work / "checkpoint-vs-state.png"
    try:
        print(f"plot: {plot_results(results, png)}")
    except Exception as exc:  # a plot is not worth failing a run of minutes for
        print(f"no plot: {exc!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
