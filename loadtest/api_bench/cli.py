"""The command line of the state API benchmark (``python -m loadtest.api_bench``)."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.api_bench.config import DEFAULT_REPORT_DIR, ENGINE_NAMES, ENGINES, BenchConfig


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    d = BenchConfig()
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.api_bench",
        description="One stateful job as Spark's transformWithStateInPandas (RocksDB), "
        "applyInPandasWithState and dstl's transform_with_state: batch and checkpoint times.",
    )
    parser.add_argument("--keys", type=int, help=f"keys in state at the end ({d.keys:,})")
    parser.add_argument("--rows", type=int, help=f"input rows per batch ({d.rows:,})")
    parser.add_argument("--batches", type=int, help=f"micro-batches ({d.batches})")
    parser.add_argument(
        "--warmup", type=int, help=f"first batches not in the statistics ({d.warmup})"
    )
    parser.add_argument("--parallelism", type=int, help=f"cores and partitions ({d.parallelism})")
    parser.add_argument(
        "--engines",
        help=f"comma-separated, of {','.join(ENGINES)} (all; run in that order)",
    )
    parser.add_argument("--driver-memory", help=f"({d.driver_memory})")
    parser.add_argument("--timeout", type=float, help=f"seconds per engine ({d.timeout_s:.0f})")
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    ns = parser.parse_args(argv)
    overrides: dict[str, Any] = {
        "keys": ns.keys,
        "rows": ns.rows,
        "batches": ns.batches,
        "warmup": ns.warmup,
        "parallelism": ns.parallelism,
        "driver_memory": ns.driver_memory,
        "timeout_s": ns.timeout,
    }
    if ns.engines:
        engines = tuple(e.strip() for e in ns.engines.split(",") if e.strip())
        if not engines or any(e not in ENGINES for e in engines):
            parser.error(f"--engines: of {', '.join(ENGINES)}")
        overrides["engines"] = tuple(e for e in ENGINES if e in engines)
    cfg = replace(d, **{k: v for k, v in overrides.items() if v is not None})
    if min(cfg.keys, cfg.rows, cfg.batches, cfg.parallelism) < 1:
        parser.error("--keys, --rows, --batches and --parallelism must be positive")
    if not 0 <= cfg.warmup < cfg.batches:
        parser.error("--warmup must be >= 0 and below --batches")
    if cfg.new_per_batch < 1 or cfg.new_per_batch > cfg.rows:
        parser.error("keys / batches (new keys per batch) must be between 1 and --rows")

    def _stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: the sidecar and Spark stop

    signal.signal(signal.SIGTERM, _stop)

    from dstl_server.testing import ServerProcess
    from loadtest.api_bench.job import EngineRun, run_engine, session, write_input
    from loadtest.api_bench.report import goal_line, goals, measured, table, write_report

    command = shlex.join(["python", "-m", "loadtest.api_bench", *(argv or sys.argv[1:])])
    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]
    runs: list[EngineRun] = []
    with tempfile.TemporaryDirectory(prefix="dstl-api-bench-") as tmp:
        work = ns.dir if ns.dir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        distinct = write_input(work / "input", cfg)
        _log(
            f"input: {cfg.batches} batches of {cfg.rows:,} rows, {cfg.new_per_batch:,} new "
            f"keys each ({cfg.new_per_batch * cfg.batches:,} in the end), "
            f"{time.perf_counter() - t0:.1f}s"
        )
        spark = session(cfg)
        try:
            with ServerProcess(work / "sidecar") as sidecar:
                for engine in cfg.engines:
                    _log(f"{engine}: {ENGINE_NAMES[engine]} ...")
                    run = run_engine(
                        engine, spark, cfg, work / "input", work / engine, sidecar.address, _log
                    )
                    runs.append(run)
                    _log(
                        f"{engine}: {len(run.batches)} batches in {run.wall_s:.1f}s"
                        + (f" ({run.error})" if run.error else "")
                    )
        finally:
            spark.stop()
    keys_after = [cfg.new_per_batch * (b + 1) for b in range(cfg.batches)]
    load = (load_start, os.getloadavg()[0])
    path = write_report(
        ns.report_dir, cfg, runs, keys_after, distinct, time.perf_counter() - t0, load, command
    )
    stats = measured(runs, cfg.warmup)
    print(f"\nbatches {cfg.warmup}..{cfg.batches - 1} (the first {cfg.warmup} left out: warm-up)")
    print(table(stats))
    for ok, line in goals(stats):
        print(goal_line(ok, line))
    print(f"report: {path}")
    return 0 if all(r.error is None for r in runs) else 1
