"""Tables, goals and the Markdown report of the bounded benchmark."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from loadtest.bounded_bench.config import FLINK_PUBLISHED, GOAL_SPEEDUP, OPS, BenchConfig
from loadtest.bounded_bench.micro import MicroResult
from loadtest.bounded_bench.wordcount import JobResult


def micro_table(results: list[MicroResult]) -> str:
    """Ours next to Flink's published figures (ops/ms)."""
    lines = [
        "| backend | add ops/ms | get ops/ms | update ops/ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, values in FLINK_PUBLISHED.items():
        cells = " | ".join(f"{v:,.0f}" for v in values)
        lines.append(f"| Flink, Java, published: {name} | {cells} |")
    for r in results:
        cells = " | ".join(f"{r.ops_per_ms[op]:,.0f}" for op in OPS)
        lines.append(f"| dstl, Python, this machine: {r.backend} | {cells} |")
    by_name = {r.backend: r for r in results}
    single = by_name.get("single-key")
    for base in ("keyed", "keyed+changelog"):
        if single is not None and base in by_name:
            ratio = " | ".join(
                f"{single.ops_per_ms[op] / by_name[base].ops_per_ms[op]:.1f}x" for op in OPS
            )
            lines.append(f"| single-key / {base} (dstl) | {ratio} |")
    heap, rocks, sk = (FLINK_PUBLISHED[n] for n in ("HEAP", "ROCKSDB", "SINGLE_KEY"))
    lines.append(
        "| SINGLE_KEY / HEAP (Flink) | "
        + " | ".join(f"{sk[i] / heap[i]:.1f}x" for i in range(3))
        + " |"
    )
    lines.append(
        "| SINGLE_KEY / ROCKSDB (Flink) | "
        + " | ".join(f"{sk[i] / rocks[i]:.1f}x" for i in range(3))
        + " |"
    )
    return "\n".join(lines) + "\n"


def job_table(job: JobResult) -> str:
    lines = [
        "| mode | runs (s) | best (s) | median (s) | records/s (best) | CPU s (best) "
        "| output check |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    names = {
        "sorted": "sorted mode (process_bounded, single-key backend)",
        "keyed": "keyed backend (process_keyed, SQLite + DSTL sidecar, one availableNow batch)",
    }
    for mode, label in names.items():
        runs = ", ".join(f"{s:.1f}" for s in job.seconds[mode])
        best = job.best(mode)
        check = job.errors.get(mode) or "equal to the NumPy count"
        median = statistics.median(job.seconds[mode])
        lines.append(
            f"| {label} | {runs} | {best:.1f} | {median:.1f} | {job.records / best:,.0f} "
            f"| {min(job.cpu[mode]):.1f} | {check} |"
        )
    med = statistics.median(job.seconds["keyed"]) / statistics.median(job.seconds["sorted"])
    lines.append(
        f"| speedup (keyed / sorted) | | {job.speedup:.2f}x | {med:.2f}x | "
        f"| {job.cpu_ratio:.2f}x | |"
    )
    return "\n".join(lines) + "\n"


def goals(job: JobResult | None) -> list[tuple[bool, str]]:
    if job is None:
        return []
    out = [
        (
            job.speedup >= GOAL_SPEEDUP,
            f"WordCount: sorted mode {job.speedup:.2f}x the keyed backend's speed "
            f"(goal >= {GOAL_SPEEDUP:g}x)",
        ),
        (
            all(e is None for e in job.errors.values()),
            "WordCount: both modes output the exact count of every word",
        ),
    ]
    return out


def _machine() -> str:
    import pyspark

    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"PySpark {pyspark.__version__}, {platform.platform()}"
    )


def write_report(
    report_dir: Path,
    cfg: BenchConfig,
    micro: list[MicroResult] | None,
    job: JobResult | None,
    total_s: float,
    load: tuple[float, float] = (0.0, 0.0),
) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"bounded-{stamp}.md"
    parts = [
        f"# Bounded input: sorted mode vs the keyed backend ({stamp})",
        "",
        f"Machine: {_machine()}. Whole run: {total_s:.0f} s; 1-minute load average "
        f"{load[0]:.2f} at the start, {load[1]:.2f} at the end (other processes on the "
        "machine slow runs down: the job compares the best of its runs).",
        "",
        "Settings: " + ", ".join(f"`{k}={v}`" for k, v in asdict(cfg).items()),
        "",
    ]
    if micro is not None:
        parts += [
            "## (a) ValueState operations (ops/ms)",
            "",
            "As Flink's `ValueStateBenchmark` (FLIP-140's table): each operation sets the "
            "current key, then `add` updates a new key, `get` reads and `update` writes a key "
            f"with state ({cfg.micro_setup_keys:,} keys set up for the keyed backend). "
            f"{cfg.micro_ops:,} operations per measurement, median of {cfg.micro_rounds}. "
            "The keyed rows include the end of the batch (dirty rows into the SQLite "
            "pending batch, commit; changes encoded for a no-op changelog writer). The "
            "single-key backend sees keys in increasing order and drops a key's state at the "
            "next key (so its `get` finds nothing, as in Flink's SINGLE_KEY run). Flink's rows "
            "are Java/JMH figures as published, not measured here: compare ratios, not values.",
            "",
            micro_table(micro),
        ]
    if job is not None:
        k = job.keyed
        parts += [
            "## (b) WordCount in a global window (PySpark jobs)",
            "",
            f"{job.records:,} records, {job.keys:,} distinct words, "
            f"{job.input_bytes / 1e6:.1f} MB of Parquet in {cfg.files} files; "
            f"`local[{cfg.parallelism}]`, {cfg.parallelism} partitions in both modes; the same "
            "`fn(key, rows, ctx)` (a ValueState count per word, one output row per word). "
            "Timed from the call to the last output file (CPU: this process and its "
            "descendants, JVM, Python workers and sidecar); the sidecar and the Spark session "
            f"were started before, and each mode ran once on {cfg.warmup_records:,} records "
            "first (untimed).",
            "",
            job_table(job),
            "Keyed job's checkpoint: "
            f"{k.changes:,} changes, {k.logged_bytes / 1e6:.1f} MB logged, "
            f"{k.persisted_bytes / 1e6:.1f} MB persisted, state {k.state_bytes / 1e6:.1f} MB "
            f"on disk; slowest task {k.task_max_s:.1f} s (applying {k.apply_max_s:.1f} s, "
            f"persisting {k.persist_max_s:.2f} s).",
            "",
        ]
    gl = goals(job)
    if gl:
        parts += ["## Goals", ""]
        parts += [f"- **{'PASS' if ok else 'MISS'}**: {line}" for ok, line in gl]
        parts.append("")
    path.write_text("\n".join(parts))
    return path
