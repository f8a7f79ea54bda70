"""The command line of the recovery benchmark (``python -m loadtest.recovery_bench``)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.recovery_bench.config import DEFAULT_REPORT_DIR, BenchConfig


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _ratios(text: str) -> tuple[float, ...]:
    try:
        ratios = tuple(sorted({float(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None
    if any(not 0 < r < float("inf") for r in ratios):
        raise argparse.ArgumentTypeError(f"{text!r}: ratios must be finite and > 0")
    return ratios


def main(argv: Sequence[str] | None = None) -> int:
    d = BenchConfig()
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.recovery_bench",
        description="Restore time from dstl (materialization + changelog tail) vs a full "
        "snapshot of the same state vs Spark's RocksDB state store; materialization MB/s.",
    )
    parser.add_argument("--keys", type=int, help=f"keys of state ({d.keys:,})")
    parser.add_argument("--value-bytes", type=int, help=f"bytes per value ({d.value_bytes})")
    parser.add_argument(
        "--update-fraction", type=float, help=f"keys rewritten per checkpoint ({d.update_fraction})"
    )
    parser.add_argument("--tails", type=_ints, help="changelog tails, e.g. 0,10,100 (default)")
    parser.add_argument(
        "--parallelism", type=_ints, help="restore parallelisms, e.g. 2,4 (default)"
    )
    parser.add_argument("--job-parallelism", type=int, help=f"({d.job_parallelism})")
    parser.add_argument("--load-batch-keys", type=int, help=f"({d.load_batch_keys:,})")
    parser.add_argument("--repeat", type=int, help=f"whole-job restores per record ({d.repeat})")
    parser.add_argument("--driver-memory", help=f"Spark driver memory ({d.driver_memory})")
    parser.add_argument(
        "--read-cache-bytes",
        type=int,
        help="the sidecar's read cache (server default; 0: every read from S3, as on another"
        " node than the writer's)",
    )
    parser.add_argument(
        "--tail-ratios",
        type=_ratios,
        help="materialize_tail_ratio of one more job each, e.g. 0.05,0.1,0.2,0.3,0.5 (default;"
        " the job options' default ratio is always run)",
    )
    parser.add_argument(
        "--tail-min-bytes",
        type=int,
        help=f"materialize_tail_min_bytes of those jobs (the default, {d.tail_min_bytes:,})",
    )
    parser.add_argument("--skip-spark", action="store_true", help="no Spark RocksDB job (c)")
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    ns = parser.parse_args(argv)
    overrides: dict[str, Any] = {
        "keys": ns.keys,
        "value_bytes": ns.value_bytes,
        "update_fraction": ns.update_fraction,
        "tails": ns.tails,
        "restore_parallelisms": ns.parallelism,
        "job_parallelism": ns.job_parallelism,
        "load_batch_keys": ns.load_batch_keys,
        "repeat": ns.repeat,
        "driver_memory": ns.driver_memory,
        "read_cache_bytes": ns.read_cache_bytes,
        "tail_ratios": ns.tail_ratios,
        "tail_min_bytes": ns.tail_min_bytes,
    }
    cfg = replace(
        d, spark=not ns.skip_spark, **{k: v for k, v in overrides.items() if v is not None}
    )
    positive = ("keys", "job_parallelism", "load_batch_keys", "repeat")
    if any(getattr(cfg, name) < 1 for name in positive):
        parser.error(f"{', '.join(positive)} must be positive")
    if cfg.read_cache_bytes is not None and cfg.read_cache_bytes < 0:
        parser.error("--read-cache-bytes must be >= 0")
    if cfg.tail_min_bytes < 0:
        parser.error("--tail-min-bytes must be >= 0")
    if cfg.value_bytes < 8:
        parser.error("--value-bytes must be >= 8")
    if not 0 < cfg.update_fraction <= 1:
        parser.error("--update-fraction must be in (0, 1]")
    if not cfg.tails or min(cfg.tails) < 0:
        parser.error("--tails: non-negative integers")
    if not cfg.restore_parallelisms or min(cfg.restore_parallelisms) < 1:
        parser.error("--parallelism: positive integers")
    if max((cfg.job_parallelism, *cfg.restore_parallelisms)) > cfg.max_parallelism:
        parser.error(f"parallelism above max_parallelism {cfg.max_parallelism}")

    def _stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: every process started is stopped

    signal.signal(signal.SIGTERM, _stop)

    from loadtest.recovery_bench.report import (
        goals,
        mat_table,
        restore_table,
        spark_table,
        sweep_table,
        write_report,
    )
    from loadtest.recovery_bench.runner import run_dstl
    from loadtest.recovery_bench.spark_job import run_spark

    command = shlex.join(["python", "-m", "loadtest.recovery_bench", *sys.argv[1:]])
    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]
    work = ns.dir if ns.dir is not None else Path(tempfile.mkdtemp(prefix="dstl-recovery-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        _log(f"[recovery-bench] {cfg.keys:,} keys, tails {cfg.tails}; work directory {work}")
        dstl = run_dstl(cfg, work / "dstl", _log)
        spark = run_spark(cfg, work / "spark", _log) if cfg.spark else None
    except BaseException:
        _log(f"[recovery-bench] stopped early; every process stopped, files kept in {work}")
        raise
    if ns.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    load = (load_start, os.getloadavg()[0])
    path = write_report(ns.report_dir, cfg, dstl, spark, time.perf_counter() - t0, load, command)
    print("\nRestore (dstl)\n" + restore_table(cfg, dstl))
    print("Materialization (dstl)\n" + mat_table(dstl))
    if dstl.sweep:
        print("Tail ratio (dstl)\n" + sweep_table(cfg, dstl))
    if spark is not None:
        print("Spark RocksDB\n" + spark_table(spark))
    for ok, line in goals(cfg, dstl, spark):
        print(f"{'PASS' if ok else 'MISS'}: {line}")
    print(f"report: {path}")
    return 0
