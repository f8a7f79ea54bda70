"""The command line of the state API benchmark (``python -m loadtest.api_bench``)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.api_bench.config import (
    DEFAULT_REPORT_DIR,
    ENGINE_NAMES,
    ENGINES,
    PRESETS,
    BenchConfig,
    preset,
)
from loadtest.api_bench.figures import EngineRun

#: seconds an engine's process may take beyond its query's own timeout (JVM start, stop)
PROCESS_SLACK_S = 180.0


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def parse(argv: Sequence[str] | None) -> tuple[BenchConfig, argparse.Namespace]:
    d = PRESETS["default"]
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.api_bench",
        description="One stateful job (count and sum per key) as Spark's "
        "transformWithStateInPandas, dstl's transform_with_state and transform_batches, and "
        "Spark's JVM aggregation (the ceiling), each in its own process: batch and "
        "checkpoint times, PASS/MISS against issue 20's goals.",
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="default",
        help="default: 100 k keys, 20 k rows per batch, all four engines; large: 1 M keys, "
        "100 k rows per batch, 20 batches, engines vec,jvm",
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
        help=f"comma-separated, of {','.join(ENGINES)} (the preset's: {','.join(d.engines)}); "
        "run in that order",
    )
    parser.add_argument("--driver-memory", help=f"({d.driver_memory})")
    parser.add_argument("--timeout", type=float, help=f"seconds per engine ({d.timeout_s:.0f})")
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    parser.add_argument(
        "--replot", type=Path, help="redraw the PNG beside this api-*.json report and exit"
    )
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
    cfg = preset(ns.preset, **overrides)
    if min(cfg.keys, cfg.rows, cfg.batches, cfg.parallelism) < 1:
        parser.error("--keys, --rows, --batches and --parallelism must be positive")
    if not 0 <= cfg.warmup < cfg.batches:
        parser.error("--warmup must be >= 0 and below --batches")
    if cfg.new_per_batch < 1 or cfg.new_per_batch > cfg.rows:
        parser.error("keys / batches (new keys per batch) must be between 1 and --rows")
    return cfg, ns


def run_in_process(engine: str, cfg: BenchConfig, input_dir: Path, work: Path) -> EngineRun:
    """``engine`` in a process of its own (its lines go to this stdout as they come)."""
    out = work / "run.json"
    work.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "loadtest.api_bench.engine",
        engine,
        "--config",
        cfg.to_json(),
        "--input",
        str(input_dir),
        "--work",
        str(work),
        "--out",
        str(out),
    ]
    t0 = time.perf_counter()
    try:
        # run() kills the child if this process is interrupted or the time is up
        rc = subprocess.run(args, timeout=cfg.timeout_s + PROCESS_SLACK_S, check=False).returncode
    except subprocess.TimeoutExpired:
        return EngineRun(engine, wall_s=time.perf_counter() - t0, error="process timed out")
    if rc != 0 or not out.exists():
        return EngineRun(
            engine, wall_s=time.perf_counter() - t0, error=f"engine process exited with {rc}"
        )
    return EngineRun.from_json(json.loads(out.read_text()))


def main(argv: Sequence[str] | None = None) -> int:
    cfg, ns = parse(argv)
    if ns.replot is not None:
        from loadtest.api_bench.report import Report, plot

        rep = Report.from_json(json.loads(ns.replot.read_text()))
        why_not = plot(rep, ns.replot.with_suffix(".png"))
        print(why_not or ns.replot.with_suffix(".png"))
        return 0 if why_not is None else 1

    def _stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: the engine's process is killed

    signal.signal(signal.SIGTERM, _stop)

    from loadtest.api_bench.job import write_input
    from loadtest.api_bench.report import Report, write_report

    command = shlex.join(["python", "-m", "loadtest.api_bench", *(argv or sys.argv[1:])])
    t0 = time.perf_counter()
    runs: list[EngineRun] = []
    loads: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="dstl-api-bench-") as tmp:
        work = ns.dir if ns.dir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        distinct = write_input(work / "input", cfg)
        _log(
            f"preset {cfg.preset}: {cfg.batches} batches of {cfg.rows:,} rows, "
            f"{cfg.new_per_batch:,} new keys each ({cfg.new_per_batch * cfg.batches:,} in the "
            f"end), engines {','.join(cfg.engines)}; input written in "
            f"{time.perf_counter() - t0:.1f}s"
        )
        for i, engine in enumerate(cfg.engines):
            before = os.getloadavg()[0]
            _log(
                f"[{i + 1}/{len(cfg.engines)}] {engine}: {ENGINE_NAMES[engine]} (load {before:.1f}) ..."
            )
            run = run_in_process(engine, cfg, work / "input", work / engine)
            after = os.getloadavg()[0]
            runs.append(run)
            loads.append((before, after))
            _log(
                f"{engine}: {len(run.batches)} batches in {run.wall_s:.1f}s (load {after:.1f})"
                + (f" ({run.error})" if run.error else "")
            )
    rep = Report(cfg, tuple(runs), tuple(loads), tuple(distinct), time.perf_counter() - t0, command)
    path = write_report(ns.report_dir, rep)
    print()
    print(rep.summary())
    print(f"report: {path} (and .json, .png)")
    return 0 if all(r.error is None for r in runs) else 1
