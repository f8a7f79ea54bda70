"""The goals (issue 20, and issue 12's for the per-key processor): PASS, MISS or N/A."""

from __future__ import annotations

from collections.abc import Sequence

from loadtest.api_bench.config import (
    GOAL_FLAT,
    GOAL_SPEEDUP,
    GOAL_TOUCHED,
    GOAL_VEC_VS_JVM,
    GOAL_VEC_VS_PROCESSOR,
    GOAL_VEC_VS_TWS,
)
from loadtest.api_bench.figures import Batch, EngineRun
from loadtest.api_bench.stats import EngineStats, med, ratio, thirds

Goal = tuple[bool | None, str]


def _faster(by: dict[str, EngineStats], fast: str, slow: str, bound: float, what: str) -> Goal:
    if fast not in by or slow not in by:
        return None, f"{what}: not measured (needs engines {fast} and {slow})"
    f, s = by[fast].batch_ms, by[slow].batch_ms
    x = ratio(s, f)
    return x >= bound, f"{what}: median {f:,.0f} ms vs {s:,.0f} ms = {x:.1f}x (goal >= {bound:g}x)"


def _flat(by: dict[str, EngineStats], engine: str) -> Goal:
    what = f"{engine} checkpoint flat in state size"
    if engine not in by:
        return None, f"{what}: not measured"
    s = by[engine]
    x = ratio(s.state_commit_last_ms, s.state_commit_first_ms)
    if x != x:
        return None, f"{what}: the engine reported no checkpoint time"
    return (
        x <= GOAL_FLAT,
        f"{what}: last-third median {s.state_commit_last_ms:,.0f} ms vs first-third "
        f"{s.state_commit_first_ms:,.0f} ms = {x:.2f}x (goal <= {GOAL_FLAT:g}x)",
    )


def _vs_jvm(by: dict[str, EngineStats]) -> Goal:
    what = f"vec within {GOAL_VEC_VS_JVM:g}x of Spark's JVM aggregation per batch"
    if "vec" not in by or "jvm" not in by:
        return None, f"{what}: not measured (needs engines vec and jvm)"
    v, j = by["vec"].batch_ms, by["jvm"].batch_ms
    x = ratio(v, j)
    beats = f"; beats it by {j / v:.2f}x" if v < j else ""
    return (
        x <= GOAL_VEC_VS_JVM,
        f"{what}: median {v:,.0f} ms vs {j:,.0f} ms = {x:.2f}x the JVM's{beats}",
    )


def touched(run: EngineRun, distinct: Sequence[int], keys_after: Sequence[int]) -> Goal:
    """The vectorized state read + write per touched key: first third vs last third."""
    what = "vec state read + write per batch proportional to keys touched, not state size"
    if not run.batches:
        return None, f"{what}: not measured"
    own = all(b.state_rw_ms == b.state_rw_ms for b in run.batches)

    def per_key(b: Batch) -> float:
        return (b.state_rw_ms if own else b.trigger_ms) / max(1, distinct[b.batch_id])

    first, last = thirds(run.batches)
    f, la = med([per_key(b) for b in first]), med([per_key(b) for b in last])
    grew = ratio(
        med([keys_after[b.batch_id] for b in last]), med([keys_after[b.batch_id] for b in first])
    )
    x = ratio(la, f)
    src = (
        "stateReadMs + stateWriteMs"
        if own
        else "bound: the whole batch time (the engine reports no stateReadMs/stateWriteMs)"
    )
    return (
        x <= GOAL_TOUCHED,
        f"{what} ({src}): {f * 1000:,.1f} → {la * 1000:,.1f} µs per touched key, first → "
        f"last third = {x:.2f}x while the state grew {grew:.1f}x (goal <= {GOAL_TOUCHED:g}x)",
    )


def goals(
    stats: Sequence[EngineStats],
    runs: Sequence[EngineRun],
    distinct: Sequence[int],
    keys_after: Sequence[int],
) -> list[Goal]:
    """``(passed, line)`` per goal, over the measured batches; ``None``: not measured."""
    by = {s.engine: s for s in stats if s.batches}
    vec = next((r for r in runs if r.engine == "vec"), EngineRun("vec"))
    return [
        _faster(
            by,
            "vec",
            "tws",
            GOAL_VEC_VS_TWS,
            "vec faster per batch than transformWithStateInPandas",
        ),
        _faster(
            by,
            "vec",
            "dstl",
            GOAL_VEC_VS_PROCESSOR,
            "vec faster per batch than the per-key processor",
        ),
        _vs_jvm(by),
        _flat(by, "vec"),
        touched(vec, distinct, keys_after),
        _faster(
            by,
            "dstl",
            "tws",
            GOAL_SPEEDUP,
            "per-key processor faster than transformWithStateInPandas",
        ),
        _flat(by, "dstl"),
    ]


def status(ok: bool | None) -> str:
    return "PASS" if ok else "MISS" if ok is False else "N/A"


def goal_line(ok: bool | None, line: str) -> str:
    return f"{status(ok)}: {line}"
