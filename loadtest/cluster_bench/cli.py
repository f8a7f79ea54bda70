"""The command line of the multi-node benchmark (``python -m loadtest.cluster_bench``)."""

from __future__ import annotations

import argparse
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

from loadtest.cluster_bench.config import DEFAULT_REPORT_DIR, BenchConfig


def _nodes(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of node counts: {text!r}") from None
    if not counts or any(n < 2 for n in counts):
        raise argparse.ArgumentTypeError("node counts must be at least 2 (a kill needs a survivor)")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    d = BenchConfig()
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.cluster_bench",
        description="A keyed Spark job on standalone clusters of N nodes (one dstl-server "
        "each) with random node kills: checkpoint and batch durations, recovery, objects, "
        "exactly-once results.",
    )
    parser.add_argument("--nodes", type=_nodes, help="comma-separated node counts (2,3)")
    parser.add_argument("--batches", type=int, help=f"per node count (default {d.batches})")
    parser.add_argument("--rows", type=int, help=f"input rows per batch ({d.rows})")
    parser.add_argument("--keys", type=int, help=f"distinct keys ({d.keys})")
    parser.add_argument(
        "--kill-every-batches", type=int, help=f"0: no kills (default {d.kill_every_batches})"
    )
    parser.add_argument("--restart-after-s", type=float, help=f"default {d.restart_after_s:g}")
    parser.add_argument("--seed", type=int, help=f"kill victims and moments ({d.seed})")
    parser.add_argument("--parallelism", type=int, help=f"tasks per batch ({d.parallelism})")
    parser.add_argument("--warmup-batches", type=int, help=f"left out ({d.warmup_batches})")
    parser.add_argument("--stall-timeout-s", type=float, help=f"default {d.stall_timeout_s:g}")
    parser.add_argument(
        "--jvm-options",
        help="for every JVM of the clusters and their drivers (default: the JVM's own)",
    )
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    parser.add_argument(
        "--dir", type=Path, default=None, help="work directory, kept (default: temp, removed)"
    )
    ns = parser.parse_args(argv)
    overrides: dict[str, Any] = {
        "nodes": ns.nodes,
        "batches": ns.batches,
        "rows": ns.rows,
        "keys": ns.keys,
        "kill_every_batches": ns.kill_every_batches,
        "restart_after_s": ns.restart_after_s,
        "seed": ns.seed,
        "parallelism": ns.parallelism,
        "warmup_batches": ns.warmup_batches,
        "stall_timeout_s": ns.stall_timeout_s,
        "jvm_options": ns.jvm_options,
    }
    cfg = replace(d, **{k: v for k, v in overrides.items() if v is not None})
    if cfg.batches < cfg.warmup_batches + 2 or cfg.rows < 1 or cfg.keys < 1:
        parser.error("--batches must exceed --warmup-batches by 2; --rows, --keys positive")
    if cfg.kill_every_batches < 0 or cfg.restart_after_s < 0 or cfg.parallelism < 1:
        parser.error("--kill-every-batches, --restart-after-s >= 0; --parallelism >= 1")

    def _stop(signum: int, _frame: object) -> None:
        # unwinds every context manager: the drivers, the clusters and SeaweedFS stop
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)  # also when started in the background (ignored there)
    command = shlex.join(["python", "-m", "loadtest.cluster_bench", *sys.argv[1:]])
    return run(cfg, ns.report_dir, ns.dir, command)


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def run(cfg: BenchConfig, report_dir: Path, work_dir: Path | None, command: str) -> int:
    from dstl_server.testing_s3 import SeaweedS3
    from loadtest.cluster_bench.report import (
        correctness_line,
        kills_table,
        summary_table,
        write_report,
    )
    from loadtest.cluster_bench.runner import NodeCountResult, Run
    from loadtest.cluster_bench.stats import figures

    work = work_dir or Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    results: list[NodeCountResult] = []
    keep = work_dir is not None
    try:
        say(f"[cluster-bench] work directory {work}; starting SeaweedFS")
        with SeaweedS3() as s3:
            for n in cfg.nodes:
                say(
                    f"[{n} nodes] starting: {cfg.batches} batches of {cfg.rows} rows, "
                    f"a kill every {cfg.kill_every_batches} batches (seed {cfg.seed})"
                )
                r = Run(cfg, n, s3, work / f"nodes-{n}", say).run()
                results.append(r)
                say(f"[{n} nodes] done in {r.wall_s:.0f} s: {correctness_line(r)}")
    except BaseException:
        say(f"[cluster-bench] stopped early; every process stopped, logs kept in {work}")
        raise
    if keep or not all(r.exactly_once for r in results):
        say(f"[cluster-bench] logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    figs = [figures(r, cfg.warmup_batches) for r in results]
    path = write_report(cfg, results, figs, report_dir, command)
    print()
    print(summary_table(figs))
    print(kills_table(figs))
    for r in results:
        print(correctness_line(r))
    print(f"report: {path}")
    return 0 if all(r.exactly_once for r in results) else 1
