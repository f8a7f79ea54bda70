"""The report: the table, the per-batch table, the checks, Markdown, JSON and the PNG."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest.api_bench.config import ENGINE_NAMES, BenchConfig
from loadtest.api_bench.figures import EngineRun, json_safe
from loadtest.api_bench.goals import Goal, goal_line, goals, status
from loadtest.api_bench.plot import EnginePlot, draw_api_bench
from loadtest.api_bench.stats import EngineStats, measured
from loadtest.plots import EngineBatches, attempt

#: the engines' names under the bars of the plot (two short lines each)
PLOT_NAMES = {
    "tws": "Spark\ntransformWithStateInPandas",
    "apply": "Spark\napplyInPandasWithState",
    "dstl": "dstl\ntransform_with_state",
    "vec": "dstl\ntransform_batches",
    "jvm": "Spark JVM\ngroupBy().agg()",
}


def _fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:,.0f}"


def _fmt1(x: float) -> str:
    return "n/a" if x != x else f"{x:,.1f}"


def table(stats: Sequence[EngineStats]) -> str:
    head = (
        "| engine | batches | batch ms median / p90 | addBatch ms | keys/s | checkpoint ms median "
        "| state commit ms median (first → last third) | wall s "
        "| CPU s / batch (JVM, its JIT) | load 1-min |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    lines = [head]
    for s in stats:
        note = f" ({s.error})" if s.error else ""
        lines.append(
            f"| {ENGINE_NAMES[s.engine]}{note} | {s.batches} "
            f"| {_fmt(s.batch_ms)} / {_fmt(s.batch_p90_ms)} | {_fmt(s.add_batch_ms)} "
            f"| {_fmt(s.keys_per_s)} "
            f"| {_fmt(s.checkpoint_ms)} | {_fmt(s.state_commit_ms)} "
            f"({_fmt(s.state_commit_first_ms)} → {_fmt(s.state_commit_last_ms)}) "
            f"| {s.wall_s:,.1f} | {_fmt1(s.cpu_per_batch_s)} ({_fmt1(s.jvm_cpu_per_batch_s)}, "
            f"{_fmt1(s.jit_cpu_per_batch_s)}) | {s.load[0]:.1f} → {s.load[1]:.1f} |"
        )
    return "\n".join(lines)


def per_batch(runs: Sequence[EngineRun], keys_after: Sequence[int]) -> str:
    engines = [r for r in runs if r.batches]
    head = "| batch | keys in state | " + " | ".join(f"{r.engine} batch / ckpt ms" for r in engines)
    lines = [head + " |", "| --- | --- |" + " --- |" * len(engines)]
    by = [{b.batch_id: b for b in r.batches} for r in engines]
    for i, keys in enumerate(keys_after):
        cells = []
        for m in by:
            b = m.get(i)
            cells.append("" if b is None else f"{b.trigger_ms:,.0f} / {_fmt(b.checkpoint_ms)}")
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


def engine_plots(runs: Sequence[EngineRun], warmup: int) -> list[EnginePlot]:
    ran = [r for r in runs if r.batches]
    return [
        EnginePlot(e, tuple(b.state_commit_ms for b in r.batches))
        for e, r in zip(engine_batches(ran, warmup), ran, strict=True)
    ]


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


@dataclass(frozen=True, slots=True)
class Report:
    """One run's results, whatever writes them out. Frozen."""

    cfg: BenchConfig
    runs: tuple[EngineRun, ...]
    loads: tuple[tuple[float, float], ...]
    distinct: tuple[int, ...]
    seconds: float
    command: str

    @property
    def keys_after(self) -> list[int]:
        return [self.cfg.new_per_batch * (b + 1) for b in range(self.cfg.batches)]

    @property
    def stats(self) -> list[EngineStats]:
        return [
            EngineStats.of(r, self.distinct, load)
            for r, load in zip(measured(self.runs, self.cfg.warmup), self.loads, strict=True)
        ]

    @property
    def goals(self) -> list[Goal]:
        return goals(
            self.stats, measured(self.runs, self.cfg.warmup), self.distinct, self.keys_after
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "config": json.loads(self.cfg.to_json()),
            "seconds": self.seconds,
            "distinct_keys_per_batch": list(self.distinct),
            "keys_after": self.keys_after,
            "stats": [json_safe(asdict(s)) for s in self.stats],
            "goals": [{"status": status(ok), "line": line} for ok, line in self.goals],
            "runs": [r.to_json() for r in self.runs],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Report:
        """The report :meth:`to_json` wrote (to redraw its plot)."""
        return cls(
            BenchConfig.from_json(json.dumps(doc["config"])),
            tuple(EngineRun.from_json(r) for r in doc["runs"]),
            tuple((float(s["load"][0]), float(s["load"][1])) for s in doc["stats"]),
            tuple(int(d) for d in doc["distinct_keys_per_batch"]),
            float(doc["seconds"]),
            str(doc["command"]),
        )

    def summary(self) -> str:
        """What the command line prints at the end."""
        c = self.cfg
        return "\n".join(
            [
                f"batches {c.warmup}..{c.batches - 1} (the first {c.warmup} left out: warm-up)",
                table(self.stats),
                *(goal_line(ok, line) for ok, line in self.goals),
            ]
        )


def plot(rep: Report, png: Path) -> str | None:
    """Draw ``rep``'s PNG at ``png``; None once drawn, else why not."""
    cfg = rep.cfg
    lo = min((a for a, _ in rep.loads), default=0.0)
    hi = max((b for _, b in rep.loads), default=0.0)
    return attempt(
        lambda: draw_api_bench(
            engine_plots(rep.runs, cfg.warmup),
            rep.keys_after,
            png,
            f"count and sum per key: {cfg.rows:,} rows per batch, {cfg.keys:,} keys in state "
            f"at the end, local[{cfg.parallelism}]; 1-min load average {lo:.1f}-{hi:.1f}",
        )
    )


def write_report(report_dir: Path, rep: Report) -> Path:
    """``api-<UTC time>.md`` with a ``.json`` and a ``.png`` beside it; returns the ``.md``."""
    cfg = rep.cfg
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"api-{stamp}.md"
    png = path.with_suffix(".png")
    why_not = plot(rep, png)
    picture = f"![batch time by engine]({png.name})" if why_not is None else f"(no plot: {why_not})"
    path.with_suffix(".json").write_text(json.dumps(rep.to_json(), indent=1))
    text = f"""# State API benchmark ({stamp}, preset {cfg.preset})

Command: `{rep.command}`

The same stateful job (issue 20's reference job: input `k long, v long`; a count and a
sum per key in state; in Update mode one output row `k, count, total` per key of the
batch) on the same streaming Parquet input, one file per micro-batch
(`maxFilesPerTrigger=1`, `availableNow`), each engine in its own process (its own Spark
session, `local[{cfg.parallelism}]`, {cfg.parallelism} shuffle / state partitions; the
dstl engines with their own `dstl-server`), Spark UI off, loopback only. Spark's state:
RocksDB provider, changelog checkpointing on. Each batch has {cfg.rows:,} rows:
{cfg.new_per_batch:,} new keys once each, the rest on random earlier keys;
{cfg.batches} batches, {cfg.new_per_batch * cfg.batches:,} keys in state at the end.

Batch = Spark's `durationMs.triggerExecution` (addBatch: its `addBatch` part, the
stateful stage and the sink's count); keys/s = the batch's distinct keys per
second of it. Checkpoint = `walCommit` + `commitOffsets` + the state's own commit (Spark:
the state operator's `commitTimeMs`; dstl: `progress["dstl"]["checkpointDurationMs"]`).
Load: the 1-minute load average when each engine started and ended (the machine is
shared); total {rep.seconds:,.0f} s. The statistics leave out the first {cfg.warmup}
batch(es) (warm-up: Python workers, JIT, stores opening); the per-batch table has them
all. Wall s: the whole query, warm-up included. CPU s / batch: the CPU time (user + system) of the engine's whole
process tree (Spark's JVM, its Python workers, the sidecar) per batch, from the first
measured batch to the last (start-up left out): less moved by the load of a shared
machine than the wall clock.

{table(rep.stats)}

{picture}

## Goals

{chr(10).join("- " + goal_line(ok, line) for ok, line in rep.goals)}

## Per batch

{per_batch(rep.runs, rep.keys_after)}

## Checks

{chr(10).join(check_lines(rep.runs, rep.distinct))}
"""
    path.write_text(text)
    return path
