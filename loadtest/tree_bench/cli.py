"""The command line of the tree benchmark (``python -m loadtest.tree_bench``)."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.tree_bench.config import CONFIGS, DEFAULT_REPORT_DIR, BenchConfig


def main(argv: Sequence[str] | None = None) -> int:
    d = BenchConfig()
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.tree_bench",
        description="K sidecars in front of one SeaweedFS: objects, PUTs and persist latency "
        "per checkpoint, direct vs. forwarding trees.",
    )
    parser.add_argument("--nodes", "-k", type=int, help=f"sidecars (default {d.nodes})")
    parser.add_argument("--writers", "-w", type=int, help=f"writers per node ({d.writers})")
    parser.add_argument("--duration-s", type=float, help=f"measured per config ({d.duration_s:g})")
    parser.add_argument("--interval-s", type=float, help=f"checkpoint interval ({d.interval_s:g})")
    parser.add_argument("--warmup-rounds", type=int, help=f"default {d.warmup_rounds}")
    parser.add_argument("--changes-per-s", type=float, help=f"per writer ({d.changes_per_s:g})")
    parser.add_argument("--change-bytes", type=int, help=f"default {d.change_bytes}")
    parser.add_argument("--leaf-delay-ms", type=float, help=f"default {d.leaf_delay_ms:g}")
    parser.add_argument("--level-step-ms", type=float, help=f"default {d.level_step_ms:g}")
    parser.add_argument(
        "--idle-writer",
        action="store_true",
        help="one never-persisting writer on every parent (the old workaround, for comparison)",
    )
    parser.add_argument("--no-fault-proxy", action="store_true", help="skip tree4-faults")
    parser.add_argument("--tail-rate", type=float, help=f"PUTs delayed ({d.tail_rate:g})")
    parser.add_argument("--tail-min-ms", type=float)
    parser.add_argument("--tail-max-ms", type=float)
    parser.add_argument("--verify-fraction", type=float, help=f"default {d.verify_fraction:g}")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset")
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    ns = parser.parse_args(argv)
    configs = tuple(c.strip() for c in ns.configs.split(",") if c.strip())
    if not configs or any(c not in CONFIGS for c in configs):
        parser.error(f"--configs: choose from {CONFIGS}")
    overrides: dict[str, Any] = {
        "nodes": ns.nodes,
        "writers": ns.writers,
        "duration_s": ns.duration_s,
        "interval_s": ns.interval_s,
        "warmup_rounds": ns.warmup_rounds,
        "changes_per_s": ns.changes_per_s,
        "change_bytes": ns.change_bytes,
        "leaf_delay_ms": ns.leaf_delay_ms,
        "level_step_ms": ns.level_step_ms,
        "tail_rate": ns.tail_rate,
        "tail_min_ms": ns.tail_min_ms,
        "tail_max_ms": ns.tail_max_ms,
        "verify_fraction": ns.verify_fraction,
    }
    cfg = replace(
        d,
        configs=configs,
        idle_writer=ns.idle_writer,
        fault_proxy=not ns.no_fault_proxy,
        **{k: v for k, v in overrides.items() if v is not None},
    )
    if cfg.nodes < 1 or cfg.writers < 1 or cfg.duration_s <= 0 or cfg.interval_s <= 0:
        parser.error("--nodes, --writers, --duration-s and --interval-s must be positive")
    if cfg.change_bytes < 32 or cfg.change_bytes > 32 * 1024:
        parser.error("--change-bytes: 32..32768")

    from loadtest.tree_bench.report import table
    from loadtest.tree_bench.runner import run

    def _stop(signum: int, _frame: object) -> None:
        # unwinds every context manager: the sidecars, the proxy and SeaweedFS stop
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)  # also when started in the background (ignored there)

    out = run(cfg, ns.report_dir, ns.dir)
    print(table(out["results"]))
    for ok, line in out["goals"]:
        print(f"{'PASS' if ok else 'MISS'}: {line}")
    print(f"report: {out['path']}")
    return 0
