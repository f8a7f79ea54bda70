"""The printed tables and the Markdown report."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from loadtest.cluster_bench.config import RECOVERED_FACTOR, BenchConfig
from loadtest.cluster_bench.runner import NodeCountResult
from loadtest.cluster_bench.stats import Dist, Figures


def _ms(d: Dist | None) -> str:
    return "-" if d is None else f"{d.p50 * 1e3:.0f} / {d.p99 * 1e3:.0f} / {d.max * 1e3:.0f}"


def _s(d: Dist | None) -> str:
    return "-" if d is None else f"{d.p50:.2f} / {d.p99:.2f} / {d.max:.2f}"


def _opt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def verdict(r: NodeCountResult) -> str:
    return "PASS" if r.exactly_once else "MISS"


def correctness_line(r: NodeCountResult) -> str:
    kills = len(r.kills)
    got = r.expected_rows - r.missing_rows + r.unexpected_rows
    line = (
        f"{verdict(r)}: {r.nodes} nodes: exactly-once results after {kills} node "
        f"kill{'s' if kills != 1 else ''}: {got} output rows, {r.missing_rows} missing, "
        f"{r.unexpected_rows} unexpected (failure-free expectation {r.expected_rows}), "
        f"batches recorded {r.phases.last_recorded + 1}/{r.batches}"
    )
    if r.driver_exits:
        line += f", driver restarted {len(r.driver_exits)}x"
    if r.error:
        line += f"; run failed: {r.error.splitlines()[0]}"
    if r.mismatch_sample:
        line += f"; {r.mismatch_sample}"
    return line


def summary_table(figs: list[Figures]) -> str:
    lines = [
        "| nodes | batches (clean) | kills | planned->recorded ms p50 / p99 / max "
        "| checkpoint ms p50 / p99 / max | batch s p50 / p99 / max "
        "| kill -> next recorded s p50 / max | kill -> batch <= 1.5x median s p50 / max "
        "| objects per node | objects / checkpoint |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for f in figs:
        nr = (
            "-"
            if f.next_recorded is None
            else f"{f.next_recorded.p50:.1f} / {f.next_recorded.max:.1f}"
        )
        rc = "-" if f.recovered is None else f"{f.recovered.p50:.1f} / {f.recovered.max:.1f}"
        per_node = ", ".join(f"{k} {v:.0f}" for k, v in f.uploads.items())
        if f.driver_uploads:
            per_node += f", driver {f.driver_uploads:.0f}"
        lines.append(
            f"| {f.nodes} | {f.recorded} ({f.clean}) | {len(f.kills)} | {_ms(f.span)} "
            f"| {_ms(f.checkpoint)} | {_s(f.batch)} | {nr} | {rc} | {per_node} "
            f"| {f.objects_per_checkpoint:.2f} |"
        )
    return "\n".join(lines) + "\n"


def kills_table(figs: list[Figures]) -> str:
    lines = [
        "| nodes | # | node | batch | in its | s into it | worker back s | executor back s "
        "| next recorded s | batch <= 1.5x median s (batch) | batches on a node fewer "
        "| slow batches until next kill | batches hit |",
        "| ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for f in figs:
        for i, k in enumerate(f.kills, 1):
            rec = "never" if k.recovered_s is None else f"{k.recovered_s:.1f} ({k.recovered_batch})"
            hit = ", ".join(str(b) for b in k.hit_batches) or "-"
            batch = f"{k.batch} (due {k.due_batch})" if k.due_batch is not None else str(k.batch)
            lines.append(
                f"| {f.nodes} | {i} | {k.node} | {batch} | {k.phase} | {k.into_batch_s:.2f} "
                f"| {_opt(k.worker_back_s)} | {_opt(k.executor_back_s)} "
                f"| {_opt(k.next_recorded_s)} | {rec} | {k.degraded_batches} | {k.slow_batches} "
                f"| {hit} |"
            )
    return "\n".join(lines) + "\n"


def batches_table(r: NodeCountResult) -> str:
    """Every batch's phases (seconds since the first plan), for the report's appendix."""
    ph = r.phases
    t0 = min(ph.planned.values(), default=0.0)
    lines = [
        "| batch | attempts | planned | tasks_done | recorded | batch s | checkpoint ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for b in sorted(set(ph.planned) | set(ph.recorded)):
        p, td, rec = ph.planned.get(b), ph.tasks_done.get(b), ph.recorded.get(b)
        prev = ph.recorded.get(b - 1)
        cyc = f"{rec - prev:.2f}" if rec is not None and prev is not None else "-"
        ck = f"{(rec - td) * 1e3:.0f}" if rec is not None and td is not None else "-"

        def rel(t: float | None) -> str:
            return "-" if t is None else f"{t - t0:.2f}"

        lines.append(
            f"| {b} | {ph.attempts.get(b, 0)} | {rel(p)} | {rel(td)} | {rel(rec)} | {cyc} | {ck} |"
        )
    return "\n".join(lines) + "\n"


def write_report(
    cfg: BenchConfig,
    results: list[NodeCountResult],
    figs: list[Figures],
    report_dir: Path,
    command: str,
) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"cluster-{stamp}.md"
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg()) + " (1 / 5 / 15 min, at the end)"
    settings = "\n".join(
        f"| {k} | {','.join(map(str, v)) if isinstance(v, tuple) else v} |"
        for k, v in asdict(cfg).items()
    )
    parts = [
        f"# Multi-node benchmark, {stamp}\n",
        f"Command: `{command}`\n",
        f"Machine: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; load average {load}. "
        "Everything on loopback: one SeaweedFS, a Spark "
        "standalone master, N workers (1 core, one executor each) with one `dstl-server` "
        "each, and the driver with a sidecar of its own (never killed).\n",
        "| setting | value |\n| --- | --- |\n" + settings + "\n",
        "## Figures\n",
        "Distributions over the clean batches: not the warm-up batches, not a batch whose "
        "`recorded(b-1) -> recorded(b)` interval holds a kill or the restarted node's "
        "executor registering with the driver, nor the first batch planned after that "
        "(its first tasks on the new executor). *batch* = "
        "`recorded(b-1) -> recorded(b)`, *planned->recorded* = the batch under dstl (tasks, "
        "sink, record), *checkpoint* = `tasks_done -> recorded`. Recovery: from the kill "
        "to the next batch recorded, and to the first batch recorded after the kill whose "
        f"duration is within {RECOVERED_FACTOR}x the median batch. Objects: each sidecar's "
        '`dstl_uploads_total{result="ok"}`, scraped just before its kill and at the end, '
        "summed per node over its incarnations; per checkpoint = all of them (driver's "
        "sidecar included) / batches recorded.\n",
        summary_table(figs),
        "\n## Kills\n",
        "One node down at a time: a kill due while the previous victim is not back (its "
        "executor registered with the driver) waits until the third batch planned after it "
        "is back (*due* shows the batch it was due at). *in its*: the part of the batch the "
        "kill landed in (tasks and sink, checkpoint, or after the record). *batches on a node "
        "fewer*: recorded between the kill and the executor's return. *slow batches*: "
        f"longer than {RECOVERED_FACTOR}x the median, from the kill to the next kill or the "
        "end.\n",
        kills_table(figs),
        "\n## Exactly-once\n",
        "\n".join(f"- {correctness_line(r)}" for r in results) + "\n",
    ]
    for f in figs:
        parts.append(
            f"\n{f.nodes} nodes: median batch {f.median_batch_s:.2f} s; clean batches slower "
            f"than {RECOVERED_FACTOR}x the median: {f.slow_clean}; batches planned more than "
            f"once: {f.rerun_batches}.\n"
        )
    for r in results:
        for i, d in enumerate(r.driver_exits, 1):
            parts.append(
                f"\n### {r.nodes} nodes: driver exit {i} (code {d.returncode}, after batch "
                f"{d.last_recorded})\n\n```\n{d.tail}\n```\n"
            )
    parts.append("\n## Every batch\n")
    for r in results:
        parts.append(f"\n### {r.nodes} nodes (wall {r.wall_s:.0f} s)\n\n{batches_table(r)}")
    path.write_text("\n".join(parts))
    return path
