"""The command line of the chaos bench (``python -m loadtest.chaos_bench``, ``make bench-chaos``)."""

from __future__ import annotations

import argparse
import secrets
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

from loadtest.chaos_bench.config import DEFAULT_REPORT_DIR, ChaosConfig, short_config
from loadtest.chaos_bench.schedule import ScheduleError


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    d = ChaosConfig()
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.chaos_bench",
        description="A keyed job with timers on a 2-node Spark standalone cluster over "
        "SeaweedFS behind the S3 fault proxy, under a seeded random schedule of sidecar, "
        "executor, node and driver kills, a rescale and S3 503s / resets / stalls; each "
        "round's output must equal the failure-free run's.",
    )
    parser.add_argument("--seed", type=int, help="schedules of every round (default: random)")
    parser.add_argument("--minutes", type=float, help=f"run rounds this long ({d.minutes:g})")
    parser.add_argument("--rounds", type=int, help="at most this many rounds (0: by --minutes)")
    parser.add_argument("--batches", type=int, help=f"input files per round ({d.batches})")
    parser.add_argument("--rows", type=int, help=f"rows per file ({d.rows})")
    parser.add_argument("--keys", type=int, help=f"distinct keys ({d.keys})")
    parser.add_argument("--process-faults", type=int, help=f"per round ({d.process_faults})")
    parser.add_argument("--s3-windows", type=int, help=f"per round ({d.s3_windows})")
    parser.add_argument(
        "--short",
        action="store_true",
        help="the short variant of make test: seed 7, one round of 10 batches, "
        "a sidecar kill, a driver kill, a 503 and a reset window (flags given override it)",
    )
    parser.add_argument(
        "--jvm-options",
        help="for every JVM of the cluster and its drivers (default: the JVM's own; the "
        "tests pass light ones: --jvm-options='-XX:TieredStopAtLevel=1 ...')",
    )
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="work directory, kept (default: temp, removed unless a round fails)",
    )
    ns = parser.parse_args(argv)
    base = short_config(d) if ns.short else d
    overrides: dict[str, Any] = {
        "seed": ns.seed,
        "minutes": ns.minutes,
        "rounds": ns.rounds,
        "batches": ns.batches,
        "rows": ns.rows,
        "keys": ns.keys,
        "process_faults": ns.process_faults,
        "s3_windows": ns.s3_windows,
        "jvm_options": ns.jvm_options,
    }
    cfg = replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if ns.seed is None and not ns.short:
        cfg = replace(cfg, seed=secrets.randbelow(2**31))
    if cfg.rows < 1 or cfg.keys < 2 or cfg.minutes < 0 or cfg.rounds < 0:
        parser.error("--rows >= 1, --keys >= 2, --minutes >= 0, --rounds >= 0")
    try:
        cfg.spec()
    except ScheduleError as exc:
        parser.error(str(exc))

    def _stop(signum: int, _frame: object) -> None:
        # unwinds every context manager: drivers, clusters, sidecars, proxy, SeaweedFS
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    command = shlex.join(["python", "-m", "loadtest.chaos_bench", *sys.argv[1:]])
    return run(cfg, ns.report_dir, ns.dir, command)


def run(cfg: ChaosConfig, report_dir: Path, work_dir: Path | None, command: str) -> int:
    from dstl_server.testing_s3 import SeaweedS3
    from loadtest.chaos_bench.faults import through_proxy
    from loadtest.chaos_bench.report import (
        injections_lines,
        round_line,
        summary,
        write_report,
    )
    from loadtest.chaos_bench.runner import Round, RoundResult
    from loadtest.chaos_bench.schedule import draw
    from loadtest.s3fault import FaultProxyProcess

    spec = cfg.spec()
    work = work_dir or Path(tempfile.mkdtemp(prefix="chaos-bench-"))
    results: list[RoundResult] = []
    t0 = time.monotonic()
    deadline = t0 + cfg.minutes * 60.0
    say(f'[chaos] seed {cfg.seed}; reproduce: make bench-chaos BENCH_ARGS="--seed {cfg.seed}"')
    say(
        f"[chaos] {cfg.nodes} nodes, {cfg.batches} batches of {cfg.rows} rows per round, "
        f"{cfg.process_faults} process faults and {cfg.s3_windows} S3 windows per round, "
        + (f"{cfg.rounds} rounds at most, " if cfg.rounds else "")
        + f"for {cfg.minutes:g} min; work directory {work}"
    )
    try:
        with SeaweedS3() as s3, FaultProxyProcess(s3.endpoint_url, seed=cfg.seed) as proxy:
            view = through_proxy(s3, proxy.url)
            say(f"[chaos] SeaweedFS at {s3.endpoint_url}, fault proxy at {proxy.url}")
            r = 0
            while True:
                schedule = draw(cfg.seed, r, spec)
                for line in schedule.lines():
                    say(f"[chaos] schedule {line}")
                result = Round(cfg, schedule, view, proxy, work / f"round-{r}", say).run()
                results.append(result)
                say(f"[chaos] {round_line(result)}")
                for line in injections_lines(result):
                    say(f"[chaos] {line}")
                r += 1
                if cfg.rounds and r >= cfg.rounds:
                    break
                if time.monotonic() + result.wall_s > deadline:
                    break
    except BaseException:
        say(f"[chaos] stopped early; every process stopped, logs kept in {work}")
        raise
    wall_s = time.monotonic() - t0
    ok = bool(results) and all(r.passed for r in results)
    if work_dir is not None or not ok:
        say(f"[chaos] logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    path = write_report(cfg, results, report_dir, command, wall_s)
    print()
    for res in results:
        print(round_line(res))
    print(summary(cfg.seed, results, wall_s))
    print(f"report: {path}")
    return 0 if ok else 1
