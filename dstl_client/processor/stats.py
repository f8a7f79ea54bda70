"""Figures of a processor's batches: per task (:class:`ProcessorStats`), per batch (:class:`BatchFigures`).

A task reports its :class:`ProcessorStats` as JSON in its result row (beside
its checkpoint :class:`~dstl_client.checkpoint.messages.TaskResult`); the
driver sums them and adds the checkpoint's own figures
(:class:`~dstl_client.checkpoint.stats.CheckpointStats`) into one
:class:`BatchFigures` per batch, which it logs and attaches to Spark's query
progress (:mod:`.progress`).

Frozen values: safe from any thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from dstl_client.checkpoint.stats import CheckpointStats


@dataclass(frozen=True, slots=True)
class ProcessorStats:
    """What one task of one batch did besides its checkpoint. Frozen: any thread."""

    #: input rows handed to ``handleInputRows`` (late rows passed included)
    input_rows: int = 0
    #: input rows at or before the lateness bound, dropped (``late_rows="drop"``)
    late_rows_dropped: int = 0
    #: late input rows passed to the processor (``late_rows="pass"``)
    late_rows_passed: int = 0
    initial_state_rows: int = 0
    keys: int = 0
    timers_fired: int = 0
    ttl_evicted: int = 0
    output_rows: int = 0
    #: state rows of the task's key groups after the batch (``-1``: not counted)
    state_rows: int = 0
    #: wall ms reading the state of the batch's keys in bulk (vectorized tasks; else 0)
    state_read_ms: int = 0
    #: wall ms writing and logging the batch's state changes in bulk (vectorized tasks)
    state_write_ms: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ProcessorStats:
        doc = json.loads(data)
        known = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in doc.items() if k in known})

    @classmethod
    def total(cls, parts: Sequence[ProcessorStats]) -> ProcessorStats:
        """Sums over tasks (``state_rows`` is ``-1`` if a task did not count)."""
        sums = {f.name: sum(getattr(p, f.name) for p in parts) for f in fields(cls)}
        if any(p.state_rows < 0 for p in parts):
            sums["state_rows"] = -1
        return cls(**sums)


@dataclass(frozen=True, slots=True)
class BatchFigures:
    """One batch of a processor query: its times, what it did, what its checkpoint cost.

    Frozen: any thread.
    """

    batch_id: int
    processing_time_ms: int
    watermark_ms: int
    processor: ProcessorStats
    checkpoint_s: float = 0.0
    persisted_bytes: int = 0
    state_bytes: int = 0
    changes: int = 0
    batch_s: float | None = None

    @classmethod
    def of(
        cls,
        batch_id: int,
        processing_time_ms: int,
        watermark_ms: int,
        tasks: Sequence[ProcessorStats],
        checkpoint: CheckpointStats | None,
    ) -> BatchFigures:
        ck = checkpoint or CheckpointStats(batch_id=batch_id)
        return cls(
            batch_id=batch_id,
            processing_time_ms=processing_time_ms,
            watermark_ms=watermark_ms,
            processor=ProcessorStats.total(tasks),
            checkpoint_s=ck.checkpoint_s,
            persisted_bytes=ck.persisted_bytes,
            state_bytes=ck.state_bytes,
            changes=ck.changes,
            batch_s=ck.batch_s,
        )

    def to_json(self) -> dict[str, Any]:
        """Flat, camelCase (the style of Spark's progress JSON)."""
        p = self.processor
        return {
            "batchId": self.batch_id,
            "processingTimeMs": self.processing_time_ms,
            "watermarkMs": self.watermark_ms,
            "checkpointDurationMs": round(self.checkpoint_s * 1000),
            "bytesPersisted": self.persisted_bytes,
            "stateChanges": self.changes,
            "stateRows": p.state_rows,
            "stateBytes": self.state_bytes,
            "inputRows": p.input_rows,
            "outputRows": p.output_rows,
            "keys": p.keys,
            "timersFired": p.timers_fired,
            "ttlEvicted": p.ttl_evicted,
            "lateRowsDropped": p.late_rows_dropped,
            "lateRowsPassed": p.late_rows_passed,
            "initialStateRows": p.initial_state_rows,
            "stateReadMs": p.state_read_ms,
            "stateWriteMs": p.state_write_ms,
        }

    def describe(self) -> str:
        """One driver log line."""
        p = self.processor
        return (
            f"processor batch {self.batch_id}: {p.input_rows} rows of {p.keys} keys, "
            f"{p.output_rows} out, {p.timers_fired} timers fired, {p.ttl_evicted} TTL-evicted, "
            f"{p.late_rows_dropped} late rows dropped; checkpoint {self.checkpoint_s:.3f}s, "
            f"{self.persisted_bytes} B persisted; state {p.state_rows} rows, "
            f"{self.state_bytes} B; watermark {self.watermark_ms}"
        )
