"""The verdicts (against ``off``) and the table of a hedging benchmark run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadtest.hedging_bench.config import TARGET_EXTRA, TARGET_P999_CUT, BenchConfig
from loadtest.hedging_bench.modes import ModeResult


def verdicts(results: Sequence[ModeResult]) -> dict[str, dict[str, Any]]:
    """Against ``off``: the p99.9 cut and the extra requests of each hedging mode."""
    base = next((r for r in results if r.mode == "off"), None)
    out: dict[str, dict[str, Any]] = {}
    if base is None or base.p999_ms <= 0:
        return out
    for r in results:
        if r.mode == "off":
            continue
        cut = 1.0 - r.p999_ms / base.p999_ms
        out[r.mode] = {
            "p999_cut_pct": round(100 * cut, 1),
            "extra_put_pct": round(r.extra_put_pct, 2),
            "extra_request_pct": round(r.extra_request_pct, 2),
            "goal_met_puts": cut >= TARGET_P999_CUT and r.extra_put_pct <= 100 * TARGET_EXTRA,
            "goal_met_all_requests": cut >= TARGET_P999_CUT
            and r.extra_request_pct <= 100 * TARGET_EXTRA,
        }
    return out


def table(results: Sequence[ModeResult], cfg: BenchConfig) -> str:
    head = (
        f"{'mode':<9} {'hedge delay':<24} {'persists':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p999 ms':>8} {'max ms':>7} {'uploads':>7} {'PUTs':>6} {'DELs':>5} "
        f"{'hedges (won/skip)':>17} {'extra PUTs':>10} {'extra req':>9}"
    )
    lines = [
        f"{cfg.writers} writers, {cfg.duration_s:g}s per mode; fault: {cfg.tail_rate:.0%} of PUTs "
        f"+{cfg.tail_min_ms:g}-{cfg.tail_max_ms:g} ms",
        head,
        "-" * len(head),
    ]
    for r in results:
        hedges = f"{r.hedges_started} ({r.hedges_won}/{r.hedges_skipped_budget})"
        delay = r.hedge_delay
        if r.mode == "adaptive":
            delay += f" ~{r.hedge_delay_end_ms:.0f}"
        lines.append(
            f"{r.mode:<9} {delay:<24} {r.persists:>8} {r.p50_ms:>7.1f} {r.p99_ms:>7.1f} "
            f"{r.p999_ms:>8.1f} {r.max_ms:>7.0f} {r.uploads:>7} {r.put_requests:>6} "
            f"{r.delete_requests:>5} {hedges:>17} {r.extra_put_pct:>9.2f}% "
            f"{r.extra_request_pct:>8.2f}%"
        )
    for mode, v in verdicts(results).items():
        lines.append(
            f"{mode}: p99.9 cut {v['p999_cut_pct']:.1f}% (goal >= {TARGET_P999_CUT:.0%}) for "
            f"{v['extra_put_pct']:.2f}% extra PUTs, {v['extra_request_pct']:.2f}% extra requests "
            f"with loser deletes (goal <= {TARGET_EXTRA:.0%}): "
            f"{'PASS' if v['goal_met_puts'] else 'MISS'} on PUTs, "
            f"{'PASS' if v['goal_met_all_requests'] else 'MISS'} on all requests"
        )
    return "\n".join(lines)
