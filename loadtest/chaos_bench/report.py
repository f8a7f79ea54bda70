"""What the chaos bench prints (per round and at the end) and its JSON report."""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest.chaos_bench.config import ChaosConfig
from loadtest.chaos_bench.runner import RoundResult
from loadtest.chaos_bench.schedule import FaultKind


def verdict(passed: bool) -> str:
    return "PASS" if passed else "MISS"


def round_line(r: RoundResult) -> str:
    """One line per round: verdict, rows, faults injected."""
    s = r.schedule
    got = r.expected_rows - r.missing_rows + r.unexpected_rows
    fired = sum(r.injected().values())
    line = (
        f"{verdict(r.passed)}: round {s.round} (seed {s.seed}): {fired}/{len(s.faults)} faults "
        f"injected, {r.batches} batches, {got} output rows, {r.missing_rows} missing, "
        f"{r.unexpected_rows} unexpected (failure-free expectation {r.expected_rows}; "
        f"{r.late_rows} late rows dropped), {len(r.driver_exits)} unplanned driver exits, "
        f"{r.wall_s:.0f} s"
    )
    if r.ambiguous_rows:
        line += f"; {r.ambiguous_rows} rows late under one lateness bound only"
    if r.error:
        line += f"; failed: {r.error.splitlines()[0]}"
    if r.mismatch_sample:
        line += f"; {r.mismatch_sample}"
    return line


def injections_lines(r: RoundResult) -> list[str]:
    """How each scheduled fault went."""
    out = []
    for i in r.injections:
        if i.fired:
            how = f"fired at batch {i.fired_batch}"
            if i.deferred:
                how += " (deferred)"
            if i.recovered_at:
                how += f", recovered {i.recovered_at - i.fired_at:.1f} s later"
        else:
            how = f"not injected: {i.skipped or 'the round failed first'}"
        out.append(f"  {i.fault.describe()}: {how}")
    return out


def totals(results: list[RoundResult]) -> tuple[Counter[FaultKind], Counter[FaultKind]]:
    """Faults scheduled and injected per kind over all rounds."""
    scheduled: Counter[FaultKind] = Counter()
    injected: Counter[FaultKind] = Counter()
    for r in results:
        scheduled.update(r.schedule.counts())
        injected.update(r.injected())
    return scheduled, injected


def summary(seed: int, results: list[RoundResult], wall_s: float) -> str:
    """The closing table: each fault kind's counts, the proxy's, and the verdict."""
    scheduled, injected = totals(results)
    proxy: Counter[str] = Counter()
    for r in results:
        proxy.update(r.proxy_faults)
    lines = [
        f"chaos bench, seed {seed}: {len(results)} rounds in {wall_s / 60:.1f} min",
        f"{'fault':<16}{'scheduled':>10}{'injected':>10}",
    ]
    for kind in FaultKind:
        lines.append(f"{kind:<16}{scheduled[kind]:>10}{injected[kind]:>10}")
    requests = sum(r.proxy_requests for r in results)
    lines.append(
        f"S3 requests through the proxy: {requests}; faulted: {proxy['503']} answered 503, "
        f"{proxy['reset']} reset, {proxy['latency']} stalled"
    )
    exits = sum(len(r.driver_exits) for r in results)
    lines.append(f"driver exits nobody caused (a new driver started each time): {exits}")
    ok = bool(results) and all(r.passed for r in results)
    lines.append(
        f"{verdict(ok)}: final output equals the failure-free run in "
        f"{sum(r.passed for r in results)}/{len(results)} rounds"
    )
    if not ok:
        lines.append(f'reproduce: make bench-chaos BENCH_ARGS="--seed {seed}"')
    return "\n".join(lines)


def write_report(
    cfg: ChaosConfig, results: list[RoundResult], report_dir: Path, command: str, wall_s: float
) -> Path:
    """``chaos-<UTC time>.json``: the config, each round's schedule, injections and result."""
    report_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    scheduled, injected = totals(results)
    rounds: list[dict[str, Any]] = []
    for r in results:
        rounds.append(
            {
                "round": r.schedule.round,
                "passed": r.passed,
                "schedule": r.schedule.lines(),
                "injections": [
                    {**asdict(i), "fault": {**asdict(i.fault), "kind": str(i.fault.kind)}}
                    for i in r.injections
                ],
                "driver_exits": [
                    {"returncode": e.returncode, "after": e.last_recorded} for e in r.driver_exits
                ],
                "proxy_faults": r.proxy_faults,
                "proxy_requests": r.proxy_requests,
                "batches": r.batches,
                "expected_rows": r.expected_rows,
                "late_rows": r.late_rows,
                "ambiguous_rows": r.ambiguous_rows,
                "missing_rows": r.missing_rows,
                "unexpected_rows": r.unexpected_rows,
                "mismatch_sample": r.mismatch_sample,
                "wall_s": r.wall_s,
                "error": r.error,
                "work": str(r.work) if r.work else "",
            }
        )
    doc = {
        "command": command,
        "time": now.isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": {**asdict(cfg), "kinds": [str(k) for k in cfg.kinds]},
        "wall_s": wall_s,
        "scheduled": {str(k): v for k, v in scheduled.items()},
        "injected": {str(k): v for k, v in injected.items()},
        "passed": bool(results) and all(r.passed for r in results),
        "rounds": rounds,
    }
    path = report_dir / f"chaos-{now.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path
