"""The command line of the bounded benchmark (``python -m loadtest.bounded_bench``)."""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.bounded_bench.config import DEFAULT_REPORT_DIR, BenchConfig


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    d = BenchConfig()
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bounded_bench",
        description="Sorted mode (single-key backend) vs the keyed backend: ValueState "
        "ops/ms next to Flink's FLIP-140 figures, and WordCount as PySpark jobs.",
    )
    parser.add_argument("--records", type=int, help=f"job input records ({d.records:,})")
    parser.add_argument("--keys", type=int, help=f"distinct words ({d.keys:,})")
    parser.add_argument("--files", type=int, help=f"Parquet files ({d.files})")
    parser.add_argument("--parallelism", type=int, help=f"partitions and cores ({d.parallelism})")
    parser.add_argument("--repeat", type=int, help=f"timed runs per mode ({d.repeat})")
    parser.add_argument("--warmup-records", type=int, help=f"({d.warmup_records:,}; 0: none)")
    parser.add_argument("--driver-memory", help=f"({d.driver_memory})")
    parser.add_argument("--micro-ops", type=int, help=f"ops per measurement ({d.micro_ops:,})")
    parser.add_argument("--micro-setup-keys", type=int, help=f"({d.micro_setup_keys:,})")
    parser.add_argument("--micro-rounds", type=int, help=f"({d.micro_rounds})")
    parser.add_argument("--skip-micro", action="store_true", help="no micro-benchmark")
    parser.add_argument("--skip-job", action="store_true", help="no Spark jobs")
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    ns = parser.parse_args(argv)
    overrides: dict[str, Any] = {
        "records": ns.records,
        "keys": ns.keys,
        "files": ns.files,
        "parallelism": ns.parallelism,
        "repeat": ns.repeat,
        "warmup_records": ns.warmup_records,
        "driver_memory": ns.driver_memory,
        "micro_ops": ns.micro_ops,
        "micro_setup_keys": ns.micro_setup_keys,
        "micro_rounds": ns.micro_rounds,
    }
    cfg = replace(
        d,
        micro=not ns.skip_micro,
        job=not ns.skip_job,
        **{k: v for k, v in overrides.items() if v is not None},
    )
    positive = ("records", "keys", "files", "parallelism", "repeat", "micro_ops", "micro_rounds")
    if any(getattr(cfg, name) < 1 for name in positive) or cfg.micro_setup_keys < 1:
        parser.error(f"{', '.join(positive)} and --micro-setup-keys must be positive")
    if cfg.keys > cfg.records:
        parser.error("--keys must not exceed --records")
    if cfg.warmup_records < 0:
        parser.error("--warmup-records must be >= 0")

    def _stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: the sidecar and Spark stop

    signal.signal(signal.SIGTERM, _stop)

    from loadtest.bounded_bench.micro import run_micro
    from loadtest.bounded_bench.report import goals, job_table, micro_table, write_report
    from loadtest.bounded_bench.wordcount import run_job

    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dstl-bounded-bench-") as tmp:
        work = ns.dir if ns.dir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        micro = None
        if cfg.micro:
            micro = run_micro(
                work,
                ops=cfg.micro_ops,
                setup_keys=cfg.micro_setup_keys,
                rounds=cfg.micro_rounds,
                log=_log,
            )
        job = run_job(cfg, work, log=_log) if cfg.job else None
    load = (load_start, os.getloadavg()[0])
    path = write_report(ns.report_dir, cfg, micro, job, time.perf_counter() - t0, load)
    if micro is not None:
        print("\n(a) ValueState ops/ms\n" + micro_table(micro))
    if job is not None:
        print("(b) WordCount in a global window\n" + job_table(job))
    for ok, line in goals(job):
        print(f"{'PASS' if ok else 'MISS'}: {line}")
    print(f"report: {path}")
    return 0
