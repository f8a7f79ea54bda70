"""One engine's figures: a :class:`Batch` per micro-batch, read from Spark's query progress.

Typed records, frozen where they are values; JSON in and out (an engine runs in
its own process and hands its :class:`EngineRun` back as JSON; ``NaN`` travels
as ``null``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from loadtest.api_bench.config import SIDECAR_ENGINES

NAN = float("nan")


def json_safe(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its NaN values as None (JSON has no NaN)."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in doc.items()}


@dataclass(frozen=True, slots=True)
class Batch:
    """One micro-batch of one engine, from Spark's progress. Frozen."""

    batch_id: int
    input_rows: int
    output_rows: int
    trigger_ms: float
    add_batch_ms: float
    #: offset and commit logs (``walCommit`` + ``commitOffsets``)
    log_ms: float
    #: the state's own checkpoint: the state store commit (Spark) or dstl's checkpoint
    #: (NaN: the engine gave no figure)
    state_commit_ms: float
    state_rows: int | None
    #: the state's bulk read + write in the batch's tasks (the vectorized engine's
    #: ``stateReadMs`` + ``stateWriteMs``; NaN: not reported)
    state_rw_ms: float = NAN
    #: CPU seconds of the engine's whole process tree so far, sampled when the batch was
    #: recorded (NaN: not sampled)
    cpu_s: float = NAN
    #: ... of which the JVM's, and of that its JIT compiler threads' (NaN: not sampled;
    #: :mod:`loadtest.api_bench.cpu`)
    jvm_cpu_s: float = NAN
    jit_cpu_s: float = NAN

    @property
    def checkpoint_ms(self) -> float:
        return self.log_ms + self.state_commit_ms

    def to_json(self) -> dict[str, Any]:
        return json_safe(asdict(self))

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Batch:
        floats = {f.name for f in fields(cls) if f.type == "float"}
        kw: dict[str, Any] = {
            f.name: NAN if raw.get(f.name) is None and f.name in floats else raw.get(f.name)
            for f in fields(cls)
        }
        return cls(**kw)


@dataclass(slots=True)
class EngineRun:
    """One engine's batches and how long it ran. Filled by one thread (the engine's runner)."""

    engine: str
    batches: list[Batch] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None
    #: CPU seconds (user + system) of the engine's whole process tree (its JVM, Python
    #: workers and sidecar included), warm-up and start-up included; NaN: not measured
    cpu_s: float = NAN

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "batches": [b.to_json() for b in self.batches],
            "wall_s": self.wall_s,
            "error": self.error,
            "cpu_s": None if math.isnan(self.cpu_s) else self.cpu_s,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> EngineRun:
        return cls(
            str(raw["engine"]),
            [Batch.from_json(b) for b in raw["batches"]],
            float(raw["wall_s"]),
            None if raw.get("error") is None else str(raw["error"]),
            NAN if raw.get("cpu_s") is None else float(raw["cpu_s"]),
        )


def _ms(d: dict[str, Any], *names: str) -> float:
    """The sum of ``d``'s figures ``names``; NaN if none of them is there."""
    got = [float(d[n]) for n in names if d.get(n) is not None]
    return sum(got) if got else NAN


def batch_of(progress: dict[str, Any], engine: str, output_rows: int) -> Batch:
    """The :class:`Batch` of one Spark progress dictionary of ``engine``."""
    d = progress.get("durationMs") or {}
    ops = progress.get("stateOperators") or []
    rw = NAN
    if engine in SIDECAR_ENGINES:
        fig = progress.get("dstl") or {}
        state_ms = _ms(fig, "checkpointDurationMs")
        state_rows = fig.get("stateRows")
        rw = _ms(fig, "stateReadMs", "stateWriteMs")
    else:
        state_ms = float(sum(op.get("commitTimeMs", 0) for op in ops))
        state_rows = sum(int(op.get("numRowsTotal", 0)) for op in ops) if ops else None
    return Batch(
        batch_id=int(progress["batchId"]),
        input_rows=int(progress.get("numInputRows", 0)),
        output_rows=output_rows,
        trigger_ms=float(d.get("triggerExecution", 0)),
        add_batch_ms=float(d.get("addBatch", 0)),
        log_ms=float(d.get("walCommit", 0)) + float(d.get("commitOffsets", 0)),
        state_commit_ms=state_ms,
        state_rows=None if state_rows is None else int(state_rows),
        state_rw_ms=rw,
    )
