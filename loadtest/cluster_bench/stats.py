"""The figures of one node count, derived from its phase log, kills and upload counts.

Per batch ``b`` (times from the driver's phase log):

* **batch**: ``recorded(b-1) -> recorded(b)``, one whole micro-batch as the
  stream runs them back to back (input reading and Spark's own commit
  included);
* **planned->recorded**: the batch under dstl: its tasks, the sink and the
  checkpoint record;
* **checkpoint**: ``tasks_done -> recorded``, the checkpoint's own part
  (the coordinator completes the batch and writes its record).

A batch is *hit* by a kill when its ``recorded(b-1) -> recorded(b)`` interval
holds the kill (its tasks on the node are lost and run again elsewhere) or
the moment the restarted node's executor registered with the driver, and
the first batch planned after that moment (the first with tasks on the new
executor: Python workers started, key groups restored from S3); hit batches
and the warm-up batches are left out of the distributions. The batches in
between ran on one node fewer and stay in. Recovery after a kill: the time until the next batch was
recorded, and until the first batch recorded after the kill whose duration
is within :data:`~loadtest.cluster_bench.config.RECOVERED_FACTOR` of the
median batch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from loadtest.cluster_bench.config import RECOVERED_FACTOR
from loadtest.cluster_bench.runner import KillEvent, NodeCountResult


@dataclass(frozen=True, slots=True)
class Dist:
    """p50 / p99 / max of a list of seconds (linear interpolation between ranks)."""

    n: int
    p50: float
    p99: float
    max: float

    @staticmethod
    def of(values: list[float]) -> Dist | None:
        if not values:
            return None
        v = sorted(values)
        return Dist(len(v), percentile(v, 50), percentile(v, 99), v[-1])


def percentile(sorted_values: list[float], q: float) -> float:
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class KillFigures:
    node: str
    batch: int
    #: the batch the kill was due at, when it waited for the previous victim to be back
    due_batch: int | None
    #: where the batch in flight was: "tasks" (tasks and sink), "checkpoint", "after record"
    phase: str
    into_batch_s: float
    worker_back_s: float | None
    executor_back_s: float | None
    next_recorded_s: float | None
    recovered_s: float | None
    recovered_batch: int | None
    #: batches slower than RECOVERED_FACTOR x median from the kill until the next kill (or end)
    slow_batches: int
    #: batches the kill hit (left out of the distributions)
    hit_batches: list[int]
    #: batches recorded between the kill and the executor's return (one node fewer)
    degraded_batches: int


@dataclass(frozen=True, slots=True)
class Figures:
    nodes: int
    recorded: int
    clean: int
    span: Dist | None
    checkpoint: Dist | None
    batch: Dist | None
    median_batch_s: float
    #: clean batches (no kill in them) slower than RECOVERED_FACTOR x median
    slow_clean: int
    kills: list[KillFigures]
    next_recorded: Dist | None
    recovered: Dist | None
    uploads: dict[str, float]
    driver_uploads: float
    objects_per_checkpoint: float
    rerun_batches: int


def _interval(r: NodeCountResult, b: int) -> tuple[float, float] | None:
    ph = r.phases
    if b not in ph.recorded:
        return None
    start = ph.recorded.get(b - 1, ph.planned.get(b, ph.recorded[b]))
    return start, ph.recorded[b]


def _phase_at(r: NodeCountResult, k: KillEvent) -> str:
    ph = r.phases
    if k.killed_at < ph.tasks_done.get(k.batch, float("inf")):
        return "tasks"
    if k.killed_at < ph.recorded.get(k.batch, float("inf")):
        return "checkpoint"
    return "after record"


def figures(r: NodeCountResult, warmup: int) -> Figures:
    ph = r.phases
    batches = sorted(ph.recorded)
    hit: dict[int, list[int]] = {i: [] for i in range(len(r.kills))}
    first_after_back = {
        i: min((b for b, t in ph.planned.items() if t >= k.rejoined_at), default=None)
        for i, k in enumerate(r.kills)
        if k.rejoined_at
    }
    clean: list[int] = []
    for b in batches:
        iv = _interval(r, b)
        assert iv is not None
        hit_by = [
            i
            for i, k in enumerate(r.kills)
            if iv[0] <= k.killed_at <= iv[1]
            or (k.rejoined_at and iv[0] <= k.rejoined_at <= iv[1])
            or first_after_back.get(i) == b
        ]
        for i in hit_by:
            hit[i].append(b)
        if b >= max(warmup, 1) and not hit_by:
            clean.append(b)
    span = [ph.recorded[b] - ph.planned[b] for b in clean if b in ph.planned]
    ckpt = [ph.recorded[b] - ph.tasks_done[b] for b in clean if b in ph.tasks_done]
    cycle = [ph.recorded[b] - ph.recorded[b - 1] for b in clean if b - 1 in ph.recorded]
    median = statistics.median(cycle) if cycle else 0.0
    limit = RECOVERED_FACTOR * median

    def duration(b: int) -> float:
        iv = _interval(r, b)
        assert iv is not None
        return iv[1] - iv[0]

    kills: list[KillFigures] = []
    for i, k in enumerate(r.kills):
        after = [b for b in batches if ph.recorded[b] > k.killed_at]
        until = r.kills[i + 1].killed_at if i + 1 < len(r.kills) else float("inf")
        window = [b for b in after if ph.recorded[b] <= until]
        ok = next((b for b in after if b - 1 in ph.recorded and duration(b) <= limit), None)
        kills.append(
            KillFigures(
                node=k.node,
                batch=k.batch,
                due_batch=k.due_batch,
                phase=_phase_at(r, k),
                into_batch_s=k.killed_at - ph.planned.get(k.batch, k.killed_at),
                worker_back_s=k.restarted_at - k.killed_at if k.restarted_at else None,
                executor_back_s=k.rejoined_at - k.killed_at if k.rejoined_at else None,
                next_recorded_s=ph.recorded[after[0]] - k.killed_at if after else None,
                recovered_s=ph.recorded[ok] - k.killed_at if ok is not None else None,
                recovered_batch=ok,
                slow_batches=sum(1 for b in window if duration(b) > limit),
                hit_batches=hit[i],
                degraded_batches=sum(
                    1 for b in after if k.rejoined_at == 0.0 or ph.recorded[b] <= k.rejoined_at
                ),
            )
        )
    total_uploads = sum(r.uploads.values()) + r.driver_uploads
    return Figures(
        nodes=r.nodes,
        recorded=len(batches),
        clean=len(clean),
        span=Dist.of(span),
        checkpoint=Dist.of(ckpt),
        batch=Dist.of(cycle),
        median_batch_s=median,
        slow_clean=sum(1 for b in clean if duration(b) > limit),
        kills=kills,
        next_recorded=Dist.of([k.next_recorded_s for k in kills if k.next_recorded_s is not None]),
        recovered=Dist.of([k.recovered_s for k in kills if k.recovered_s is not None]),
        uploads=dict(r.uploads),
        driver_uploads=r.driver_uploads,
        objects_per_checkpoint=total_uploads / len(batches) if batches else 0.0,
        rerun_batches=sum(1 for n in ph.attempts.values() if n > 1),
    )
