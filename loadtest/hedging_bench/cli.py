"""The command line of the hedging benchmark (``python -m loadtest.hedging_bench``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.hedging_bench.config import DEFAULT_REPORT_DIR, MODES, QUICK, BenchConfig
from loadtest.hedging_bench.runner import run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.hedging_bench",
        description="Persist latency under an injected heavy tail: hedging off / fixed / "
        "adaptive, and the extra requests each costs.",
    )
    d = BenchConfig()
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--writers", type=int, default=None, help=f"default {d.writers}")
    parser.add_argument("--processes", type=int, default=None, help=f"default {d.processes}")
    parser.add_argument("--duration", type=float, default=None, help="seconds measured per mode")
    parser.add_argument("--warmup", type=float, default=None, help="seconds before measuring")
    parser.add_argument(
        "--think-ms", type=float, default=None, help="mean pause between checkpoints"
    )
    parser.add_argument("--tail-rate", type=float, default=None, help="fraction of PUTs delayed")
    parser.add_argument("--tail-min-ms", type=float, default=None)
    parser.add_argument("--tail-max-ms", type=float, default=None)
    parser.add_argument("--fixed-delay-ms", type=float, default=None, help="fixed-mode hedge delay")
    parser.add_argument("--hedge-quantile", type=float, default=None, help="adaptive quantile")
    parser.add_argument("--hedge-budget-fraction", type=float, default=None)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    ns = parser.parse_args(argv)
    cfg = replace(d, **QUICK, quick=True) if ns.quick else d
    overrides: dict[str, Any] = {
        "writers": ns.writers,
        "processes": ns.processes,
        "duration_s": ns.duration,
        "warmup_s": ns.warmup,
        "think_ms": ns.think_ms,
        "tail_rate": ns.tail_rate,
        "tail_min_ms": ns.tail_min_ms,
        "tail_max_ms": ns.tail_max_ms,
        "fixed_delay_ms": ns.fixed_delay_ms,
        "hedge_quantile": ns.hedge_quantile,
        "hedge_budget_fraction": ns.hedge_budget_fraction,
    }
    modes = tuple(m.strip() for m in ns.modes.split(",") if m.strip())
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: choose from {MODES}")
    cfg = replace(cfg, modes=modes, **{k: v for k, v in overrides.items() if v is not None})
    report = run(cfg, ns.report_dir)
    print(report["table"])
    print(f"report: {report['path']}")
    return 0
