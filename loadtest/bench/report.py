"""The report of a run: the table printed at the end, and the JSON file."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest.bench.config import MiB


def format_report(report: dict[str, Any]) -> str:
    """The human-readable table printed at the end of a run."""
    cfg = report["config"]
    lines = [
        "",
        f"dstl benchmark -- {report['machine']['cpus']} CPUs, Python {report['machine']['python']}, "
        f"file:// store, fsync {'on' if cfg['fsync'] else 'off'}, "
        f"persist delay {cfg['persist_delay_ms']:g} ms, {cfg.get('transport', 'unary')} "
        f"transport, {report['seconds']:g}s",
        "",
        "Append (batched, pre-emptive uploads on; MB = 10^6 bytes of change payload)",
        f"  {'run':<8}{'writers':>8}{'change':>9}{'changes/s':>13}{'MB/s':>9}"
        f"{'store MB/s':>12}{'ratio':>7}{'objects':>9}{'peak RSS':>10}{'srv CPU':>9}"
        f"{'wrt CPU':>9}",
    ]
    for a in report["append"]:
        lines.append(
            f"  {a['name']:<8}{a['writers']:>8}{a['change_bytes']:>8}B{a['changes_per_s']:>13,.0f}"
            f"{a['mb_per_s']:>9,.1f}{a['baseline']['mb_per_s']:>12,.1f}{a['ratio_to_store']:>7.2f}"
            f"{a['uploads']:>9}{a['rss']['peak_bytes'] / MiB:>7,.0f}MiB"
            f"{a['server_cpu_cores']:>9.2f}{a['writers_cpu_cores']:>9.2f}"
        )
    lines += [
        "  (ratio = bytes stored per second through the service / the same bytes put straight "
        "into the store;",
        "   srv CPU / wrt CPU = cores the server / the writer processes used, on the same "
        f"{report['machine']['cpus']} cores)",
        "",
        "Checkpoints (all writers persist together; latency in ms, client side)",
        f"  {'writers':>7}{'p50':>8}{'p99':>8}{'p99.9':>8}{'put p50':>9}{'put p99':>9}"
        f"{'added p50':>11}{'p99':>7}{'p99.9':>7}{'obj/flush':>10}{'flush/rnd':>10}{'logs/obj':>9}",
    ]
    for c in report["checkpoint"]:
        p, s, d = c["persist_ms"], c["store_put_ms"], c["added_ms"]
        lines.append(
            f"  {c['writers']:>7}{p['p50']:>8.2f}{p['p99']:>8.2f}{p['p999']:>8.2f}"
            f"{s['p50']:>9.2f}{s['p99']:>9.2f}{d['p50']:>11.2f}{d['p99']:>7.2f}{d['p999']:>7.2f}"
            f"{c['objects_per_flush']:>10g}{c['flushes_per_round']:>10g}{c['logs_per_object_mean']:>9g}"
        )
    lines += [
        f"  (added = persist - {cfg['persist_delay_ms']:g} ms persist delay - store put, "
        "quantile by quantile, floored at 0)",
        "",
        "Checkpoint diagnostics",
        f"  {'writers':>7}{'flushes by trigger':>34}{'call spread p50/max ms':>24}"
        f"{'srv persist mean ms':>21}{'srv CPU ms/round':>18}{'us/persist':>12}",
    ]
    for c in report["checkpoint"]:
        triggers = " ".join(f"{k}={v}" for k, v in sorted(c["flushes_by_trigger"].items()))
        spread = f"{c['call_spread_ms']['p50']:.1f} / {c['call_spread_ms']['max']:.1f}"
        lines.append(
            f"  {c['writers']:>7}{triggers:>34}{spread:>24}"
            f"{c['server_persist_mean_ms']:>21.2f}{c['server_cpu_ms_per_round']:>18.2f}"
            f"{c.get('server_cpu_us_per_persist', 0):>12.0f}"
        )
    rpc = report["rpc"]
    lines += [
        "  (call spread = how far apart one round's persist calls left the writers)",
        f"  one {rpc.get('transport', 'unary')} call (LastAppendedSqn, sequential): "
        f"{rpc['wall_us_per_call']:.0f} us round "
        f"trip, {rpc['server_cpu_us_per_call']:.0f} us of server CPU",
        "",
        f"Memory: idle RSS {report['memory']['idle_rss_bytes'] / MiB:,.0f} MiB, peak "
        f"{report['memory']['peak_rss_bytes'] / MiB:,.0f} MiB "
        f"(in-flight bound {report['memory']['max_in_flight_bytes'] / MiB:,.0f} MiB)",
        "",
        "Targets (README, Benchmarks)",
    ]
    for t in report["targets"]:
        verdict = "PASS" if t["pass"] else "MISS"
        lines.append(f"  {verdict}  {t['target']}: {t['measured']}  (goal {t['goal']})")
    return "\n".join(lines)


def write_report(report: dict[str, Any], report_dir: Path) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = report_dir / f"bench-{stamp}{'-quick' if report['config']['quick'] else ''}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)
    return path
