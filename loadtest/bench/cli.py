"""The command line of the benchmark (``python -m loadtest.bench``)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.bench.config import DEFAULT_REPORT_DIR, QUICK, BenchConfig, BenchError
from loadtest.bench.report import format_report, write_report
from loadtest.bench.runner import Bench


def _counts(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,8,64, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("writer counts must be >= 1")
    return out


def _positive(typ: type) -> Any:
    def parse(text: str) -> Any:
        value = typ(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench",
        description="Benchmark one dstl-server process against the sidecar's latency and throughput targets.",
    )
    p.add_argument("--quick", action="store_true", help="a few seconds per phase (smoke test)")
    p.add_argument(
        "--duration",
        type=_positive(float),
        help=f"seconds per append run (default {d.duration_s:g})",
    )
    p.add_argument(
        "--processes",
        type=_positive(int),
        help=f"writer processes in the append runs (default {d.processes})",
    )
    p.add_argument(
        "--threads",
        type=_positive(int),
        help=f"writers per process in the append runs (default {d.threads})",
    )
    p.add_argument(
        "--change-bytes",
        type=_positive(int),
        help=f"change size of the small-change run (default {d.small_change_bytes})",
    )
    p.add_argument(
        "--large-change-bytes",
        type=_positive(int),
        help=f"change size of the large-change run (default {d.large_change_bytes})",
    )
    p.add_argument(
        "--batch-bytes", type=_positive(int), help=f"client append batch (default {d.batch_bytes})"
    )
    p.add_argument(
        "--checkpoint-interval",
        type=_positive(float),
        help=f"seconds between checkpoints in the append runs (default {d.checkpoint_interval_s:g})",
    )
    p.add_argument(
        "--writers", type=_counts, help="writer counts of the checkpoint runs (default 1,8,64)"
    )
    p.add_argument(
        "--rounds", type=_positive(int), help=f"checkpoints per checkpoint run (default {d.rounds})"
    )
    p.add_argument(
        "--round-bytes",
        type=_positive(int),
        help=f"bytes each writer appends per checkpoint (default {d.round_bytes})",
    )
    p.add_argument(
        "--round-interval-ms",
        type=_positive(float),
        help=f"time between checkpoint rounds (default {d.round_interval_s * 1000:g})",
    )
    p.add_argument(
        "--appends-with-persist",
        action="store_true",
        default=None,
        help="checkpoint runs: each round's appends travel inside the persist call "
        "(the real checkpoint path) instead of being sent before the timer starts",
    )
    p.add_argument(
        "--transport",
        choices=("stream", "unary"),
        help=f"how the clients send writer calls (default {d.transport})",
    )
    p.add_argument(
        "--max-processes",
        type=_positive(int),
        help=f"writer processes in the checkpoint runs (default {d.max_processes})",
    )
    p.add_argument(
        "--persist-delay-ms",
        type=float,
        help=f"server persist delay (default {d.persist_delay_ms:g})",
    )
    p.add_argument(
        "--fsync",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fsync objects, service and baseline alike (default on)",
    )
    p.add_argument(
        "--dir",
        type=Path,
        help="work directory for objects (default: a new temp dir, removed after)",
    )
    p.add_argument(
        "--report-dir",
        type=Path,
        default=DEFAULT_REPORT_DIR,
        help="where the JSON report goes (default loadtest/reports)",
    )
    return p


def config_from_args(ns: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig(quick=ns.quick)
    if ns.quick:
        cfg = replace(cfg, **QUICK)  # type: ignore[arg-type]
    flags = {
        "duration_s": ns.duration,
        "processes": ns.processes,
        "threads": ns.threads,
        "small_change_bytes": ns.change_bytes,
        "large_change_bytes": ns.large_change_bytes,
        "batch_bytes": ns.batch_bytes,
        "checkpoint_interval_s": ns.checkpoint_interval,
        "writer_counts": ns.writers,
        "rounds": ns.rounds,
        "round_bytes": ns.round_bytes,
        "round_interval_s": ns.round_interval_ms / 1000 if ns.round_interval_ms else None,
        "max_processes": ns.max_processes,
        "persist_delay_ms": ns.persist_delay_ms,
        "fsync": ns.fsync,
        "appends_with_persist": ns.appends_with_persist,
        "transport": ns.transport,
    }
    cfg = replace(cfg, **{k: v for k, v in flags.items() if v is not None})
    if cfg.warmup_rounds >= cfg.rounds:
        cfg = replace(cfg, warmup_rounds=0)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    cfg = config_from_args(ns)
    work = ns.dir
    made = work is None
    root = Path(tempfile.mkdtemp(prefix="dstl-bench-")) if made else work.resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        report = Bench(cfg, root).run()
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if made:
            shutil.rmtree(root, ignore_errors=True)
    print(format_report(report))
    path = write_report(report, ns.report_dir)
    print(f"\nreport: {path}")
    return 0
