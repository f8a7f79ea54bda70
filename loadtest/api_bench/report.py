"""Statistics, the table, the goals and the Markdown report."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from loadtest.api_bench.config import ENGINE_NAMES, GOAL_FLAT, GOAL_SPEEDUP, BenchConfig
from loadtest.api_bench.job import Batch, EngineRun
from loadtest.plots import EngineBatches, attempt, draw_batch_time_by_engine

#: the engines' names under the bars of the plot (two short lines each)
PLOT_NAMES = {
    "tws": "Spark\ntransformWithStateInPandas",
    "apply": "Spark\napplyInPandasWithState",
    "dstl": "dstl\ntransform_with_state",
}


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measured(runs: Sequence[EngineRun], warmup: int) -> list[EngineRun]:
    """``runs`` without their first ``warmup`` batches (for the statistics)."""
    return [
        EngineRun(r.engine, [b for b in r.batches if b.batch_id >= warmup], r.wall_s, r.error)
        for r in runs
    ]


def thirds(batches: Sequence[Batch]) -> tuple[list[Batch], list[Batch]]:
    """The first and last third of ``batches`` (at least one each)."""
    n = max(1, len(batches) // 3)
    return list(batches[:n]), list(batches[-n:])


def ckpt_growth(run: EngineRun, state_only: bool = False) -> tuple[float, float]:
    """Median checkpoint ms of the first and of the last third of the batches."""
    first, last = thirds(run.batches)

    def f(b: Batch) -> float:
        return b.state_commit_ms if state_only else b.checkpoint_ms

    return med([f(b) for b in first]), med([f(b) for b in last])


def _fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:,.0f}"


def table(runs: Sequence[EngineRun]) -> str:
    head = (
        "| engine | batches | batch ms median / p90 / max | checkpoint ms median / p90 / max "
        "| checkpoint ms first → last third | state commit ms first → last third | wall s |\n"
        "| --- | --- | --- | --- | --- | --- | --- |"
    )
    lines = [head]
    for r in runs:
        t = [b.trigger_ms for b in r.batches]
        c = [b.checkpoint_ms for b in r.batches]
        f, la = ckpt_growth(r)
        sf, sl = ckpt_growth(r, state_only=True)
        note = f" ({r.error})" if r.error else ""
        lines.append(
            f"| {ENGINE_NAMES[r.engine]}{note} | {len(r.batches)} "
            f"| {_fmt(med(t))} / {_fmt(pct(t, 0.9))} / {_fmt(max(t, default=float('nan')))} "
            f"| {_fmt(med(c))} / {_fmt(pct(c, 0.9))} / {_fmt(max(c, default=float('nan')))} "
            f"| {_fmt(f)} → {_fmt(la)} | {_fmt(sf)} → {_fmt(sl)} | {r.wall_s:,.1f} |"
        )
    return "\n".join(lines)


def goals(runs: Sequence[EngineRun]) -> list[tuple[bool | None, str]]:
    """``(passed, line)`` per goal; ``None``: not measured."""
    by = {r.engine: r for r in runs if r.batches}
    out: list[tuple[bool | None, str]] = []
    if "dstl" in by and "tws" in by:
        d = med([b.trigger_ms for b in by["dstl"].batches])
        t = med([b.trigger_ms for b in by["tws"].batches])
        speedup = t / d if d > 0 else float("inf")
        out.append(
            (
                speedup >= GOAL_SPEEDUP,
                f"dstl at least {GOAL_SPEEDUP:g}x faster per batch than "
                f"transformWithStateInPandas: median {d:,.0f} ms vs {t:,.0f} ms = "
                f"{speedup:.2f}x",
            )
        )
    else:
        out.append((None, "dstl vs transformWithStateInPandas per batch: not measured"))
    if "dstl" in by:
        # dstl's own checkpoint figure; with Spark's offset and commit logs in brackets
        f, la = ckpt_growth(by["dstl"], state_only=True)
        tf, tl = ckpt_growth(by["dstl"])
        ratio = la / f if f > 0 else float("inf")
        out.append(
            (
                ratio <= GOAL_FLAT,
                f"dstl checkpoint flat in state size: last-third median {la:,.0f} ms vs "
                f"first-third {f:,.0f} ms = {ratio:.2f}x (bound {GOAL_FLAT:g}x; with the "
                f"offset and commit logs {tl:,.0f} vs {tf:,.0f} ms = {tl / tf if tf > 0 else float('inf'):.2f}x)",
            )
        )
    else:
        out.append((None, "dstl checkpoint flatness: not measured"))
    return out


def goal_line(ok: bool | None, line: str) -> str:
    return f"{'PASS' if ok else 'MISS' if ok is False else 'N/A'}: {line}"


def per_batch(runs: Sequence[EngineRun], keys_after: Sequence[int]) -> str:
    engines = [r for r in runs if r.batches]
    head = "| batch | keys in state | " + " | ".join(f"{r.engine} batch / ckpt ms" for r in engines)
    lines = [head + " |", "| --- | --- |" + " --- |" * len(engines)]
    by = [{b.batch_id: b for b in r.batches} for r in engines]
    for i, keys in enumerate(keys_after):
        cells = []
        for m in by:
            b = m.get(i)
            cells.append("" if b is None else f"{b.trigger_ms:,.0f} / {b.checkpoint_ms:,.0f}")
        lines.append(f"| {i} | {keys:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def engine_batches(runs: Sequence[EngineRun], warmup: int) -> list[EngineBatches]:
    """Every batch of each engine that ran any (warm-up included; the bars leave it out)."""
    return [
        EngineBatches(
            PLOT_NAMES.get(r.engine, r.engine),
            tuple(b.batch_id for b in r.batches),
            tuple(b.trigger_ms for b in r.batches),
            warmup,
        )
        for r in runs
        if r.batches
    ]


def write_report(
    report_dir: Path,
    cfg: BenchConfig,
    runs: Sequence[EngineRun],
    keys_after: Sequence[int],
    distinct: Sequence[int],
    seconds: float,
    load: tuple[float, float],
    command: str,
) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"api-{stamp}.md"
    stats = measured(runs, cfg.warmup)
    png = path.with_suffix(".png")
    why_not = attempt(
        lambda: draw_batch_time_by_engine(
            engine_batches(runs, cfg.warmup),
            png,
            f"{cfg.rows:,} rows per batch, {cfg.keys:,} keys in state at the end, "
            f"local[{cfg.parallelism}]; load average {load[0]:.1f} -> {load[1]:.1f}",
        )
    )
    picture = f"![batch time by engine]({png.name})" if why_not is None else f"(no plot: {why_not})"
    text = f"""# State API benchmark ({stamp})

Command: `{command}`

The same stateful job (a count and a sum per key in value state, one output row per key
and batch) on the same streaming Parquet input, one file per micro-batch
(`maxFilesPerTrigger=1`, `availableNow`), `local[{cfg.parallelism}]`,
{cfg.parallelism} shuffle (state) partitions, Spark UI off, loopback only. Each batch has
{cfg.rows:,} rows: {cfg.new_per_batch:,} new keys once each, the rest on random earlier
keys; {cfg.batches} batches, {cfg.new_per_batch * cfg.batches:,} keys in state at the end.

Batch = Spark's `durationMs.triggerExecution`. Checkpoint = `walCommit` + `commitOffsets`
+ the state's own commit (Spark: the state operator's `commitTimeMs`, RocksDB provider;
dstl: `lastProgress["dstl"]["checkpointDurationMs"]`). Load average (1 min) at start
{load[0]:.2f}, at end {load[1]:.2f}; total {seconds:,.0f} s. The statistics leave out
the first {cfg.warmup} batch(es) (warm-up: Python workers, JIT, stores opening); the
per-batch table has them all. Wall s: the whole query, warm-up included.

{table(stats)}

{picture}

## Goals

{chr(10).join("- " + goal_line(ok, line) for ok, line in goals(stats))}

## Per batch

{per_batch(runs, keys_after)}

## Checks

{chr(10).join(check_lines(runs, distinct))}
"""
    path.write_text(text)
    return path


def check_lines(runs: Sequence[EngineRun], distinct: Sequence[int]) -> list[str]:
    """Per engine: does every batch output one row per distinct key of its input?"""
    out = []
    for r in runs:
        wrong = [b.batch_id for b in r.batches if b.output_rows != distinct[b.batch_id]]
        out.append(
            f"- {r.engine}: "
            + (
                f"output rows = the batch's distinct keys in all {len(r.batches)} batches"
                if not wrong
                else f"output rows differ from the batch's distinct keys in batches {wrong}"
            )
        )
    return out
