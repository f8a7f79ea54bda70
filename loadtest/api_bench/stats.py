"""Per-engine statistics over the measured batches (medians, quantiles, thirds)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.api_bench.figures import NAN, Batch, EngineRun


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def med(values: Sequence[float]) -> float:
    """The median of the finite ``values``; NaN if none."""
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else float("nan")


def measured(runs: Sequence[EngineRun], warmup: int) -> list[EngineRun]:
    """``runs`` without their first ``warmup`` batches (for the statistics)."""
    return [
        EngineRun(
            r.engine, [b for b in r.batches if b.batch_id >= warmup], r.wall_s, r.error, r.cpu_s
        )
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


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One engine's figures over its measured batches. Frozen."""

    engine: str
    batches: int
    batch_ms: float
    batch_p90_ms: float
    #: Spark's ``addBatch`` (the stateful stage and the sink), median
    add_batch_ms: float
    #: distinct keys of a batch per second of its batch time, median
    keys_per_s: float
    checkpoint_ms: float
    state_commit_ms: float
    state_commit_first_ms: float
    state_commit_last_ms: float
    wall_s: float
    #: CPU seconds of the engine's process tree per measured batch (between the first and
    #: the last measured batch; NaN with fewer than two)
    cpu_per_batch_s: float
    error: str | None
    #: 1-minute load average when the engine started and when it ended
    load: tuple[float, float]
    #: of ``cpu_per_batch_s``: the JVM's, and of that its JIT compilers' (warm-up)
    jvm_cpu_per_batch_s: float = NAN
    jit_cpu_per_batch_s: float = NAN

    @classmethod
    def of(cls, run: EngineRun, distinct: Sequence[int], load: tuple[float, float]) -> EngineStats:
        t = [b.trigger_ms for b in run.batches]
        kps = [
            distinct[b.batch_id] / (b.trigger_ms / 1000) for b in run.batches if b.trigger_ms > 0
        ]
        sf, sl = ckpt_growth(run, state_only=True)
        return cls(
            run.engine,
            len(run.batches),
            med(t),
            pct(t, 0.9),
            med([b.add_batch_ms for b in run.batches]),
            med(kps),
            med([b.checkpoint_ms for b in run.batches]),
            med([b.state_commit_ms for b in run.batches]),
            sf,
            sl,
            run.wall_s,
            steady_cpu_s(run.batches),
            run.error,
            load,
            steady_cpu_s(run.batches, "jvm_cpu_s"),
            steady_cpu_s(run.batches, "jit_cpu_s"),
        )


def steady_cpu_s(batches: Sequence[Batch], figure: str = "cpu_s") -> float:
    """CPU seconds per batch from the first to the last of ``batches`` (start-up left out):
    of the whole tree, or of the sample ``figure`` (``jvm_cpu_s``, ``jit_cpu_s``)."""
    if len(batches) < 2:
        return NAN
    first: float = getattr(batches[0], figure)
    last: float = getattr(batches[-1], figure)
    return (last - first) / (len(batches) - 1)
