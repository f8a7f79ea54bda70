"""The verdicts of a report against the targets (the ``targets[]`` of the report)."""

from __future__ import annotations

from typing import Any

from loadtest.bench.config import (
    FLAT_RSS_FACTOR,
    FLAT_RSS_SLACK,
    LATENCY_CORES,
    TARGET_ADDED_P50_MS,
    TARGET_ADDED_P50_MS_FEW_CORES,
    TARGET_ADDED_P99_MS,
    TARGET_ADDED_P99_MS_FEW_CORES,
    TARGET_CHANGES_PER_S,
    TARGET_CPU_US_PER_PERSIST,
    TARGET_FLUSHES_PER_ROUND,
    TARGET_MB_PER_S,
    TARGET_WRITERS,
    MiB,
)


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """``target``, ``goal``, ``measured`` and ``pass`` of each target, from a report's figures."""
    append = report["append"]
    ckpt = report["checkpoint"]
    best = max(append, key=lambda a: a["mb_per_s"])
    small = min(append, key=lambda a: a["change_bytes"])
    counts = ", ".join(str(c["writers"]) for c in ckpt)
    per_flush = " / ".join(f"{c['objects_per_flush']:g}" for c in ckpt)
    biggest = max(ckpt, key=lambda c: c["writers"])
    w = biggest["writers"]
    note = "" if w >= TARGET_WRITERS else f" (only {w} writers in this run)"
    cores = int(report.get("machine", {}).get("cpus") or 0)
    many = cores >= LATENCY_CORES
    p50_goal = TARGET_ADDED_P50_MS if many else TARGET_ADDED_P50_MS_FEW_CORES
    p99_goal = TARGET_ADDED_P99_MS if many else TARGET_ADDED_P99_MS_FEW_CORES
    on = f", {cores} cores"
    return [
        {
            "target": "objects per flush",
            "goal": f"1 whatever the writer count ({counts})",
            "measured": per_flush,
            "pass": all(
                c["objects"] == c["flushes"] and c["flushes"] > 0 and not c["upload_failures"]
                for c in ckpt
            ),
        },
        {
            "target": "append throughput",
            "goal": f">= {TARGET_MB_PER_S:g} MB/s",
            "measured": f"{best['mb_per_s']:,.1f} MB/s ({best['change_bytes']} B changes)",
            "pass": best["mb_per_s"] >= TARGET_MB_PER_S,
        },
        {
            "target": "append rate",
            "goal": f">= {TARGET_CHANGES_PER_S:,.0f} changes/s",
            "measured": f"{small['changes_per_s']:,.0f} changes/s ({small['change_bytes']} B changes)",
            "pass": small["changes_per_s"] >= TARGET_CHANGES_PER_S,
        },
        {
            "target": "flat memory under appends",
            "goal": f"2nd-half RSS peak <= 1st-half x {FLAT_RSS_FACTOR:g} + {FLAT_RSS_SLACK // MiB} MiB",
            "measured": "; ".join(
                f"{a['rss']['first_half_peak_bytes'] / MiB:,.0f} -> "
                f"{a['rss']['second_half_peak_bytes'] / MiB:,.0f} MiB"
                for a in append
            ),
            "pass": report["memory"]["flat"],
        },
        {
            "target": f"added persist latency p50, {w} writers{on}{note}",
            "goal": f"{'<' if many else '<='} {p50_goal:g} ms",
            "measured": f"{biggest['added_ms']['p50']:.2f} ms",
            "pass": biggest["added_ms"]["p50"] < p50_goal
            or (not many and biggest["added_ms"]["p50"] <= p50_goal),
        },
        {
            "target": f"added persist latency p99, {w} writers{on}{note}",
            "goal": f"{'<' if many else '<='} {p99_goal:g} ms",
            "measured": f"{biggest['added_ms']['p99']:.2f} ms",
            "pass": biggest["added_ms"]["p99"] < p99_goal
            or (not many and biggest["added_ms"]["p99"] <= p99_goal),
        },
        {
            "target": f"server CPU per persist, {w} writers{note}",
            "goal": f"<= {TARGET_CPU_US_PER_PERSIST:g} us",
            "measured": f"{biggest.get('server_cpu_us_per_persist', 0):.0f} us",
            "pass": 0 < biggest.get("server_cpu_us_per_persist", 0) <= TARGET_CPU_US_PER_PERSIST,
        },
        {
            "target": f"flushes per round, {w} writers{note}",
            "goal": f"{TARGET_FLUSHES_PER_ROUND:g}",
            "measured": f"{biggest['flushes_per_round']:g}",
            "pass": biggest["flushes_per_round"] <= TARGET_FLUSHES_PER_ROUND,
        },
    ]
