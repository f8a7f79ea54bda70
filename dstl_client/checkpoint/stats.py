"""Statistics of one task (:class:`TaskStats`) and of one checkpoint, summed from them by code.

Every figure is a typed field: a sum or a peak over the tasks is spelled out
once in :meth:`CheckpointStats.of_tasks`, so a misspelt figure is an error
(at type-check time), never a silent 0. JSON (records, ``history.jsonl``)
goes through :meth:`CheckpointStats.to_json` / :meth:`from_json`.

Frozen and pure: safe from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dstl_client.checkpoint.codec import flat_from_json, flat_to_json

#: task errors of a materialization kept in a checkpoint's statistics
MAX_MAT_ERRORS = 3


def _r(seconds: float) -> float:
    return round(seconds, 4)


@dataclass(frozen=True, slots=True)
class TaskStats:
    """Figures of one task attempt of one batch; durations in seconds.

    The driver sums them into a :class:`CheckpointStats` by field, never by name.
    """

    #: input rows and distinct keys the user function saw
    rows: int = 0
    keys: int = 0
    #: state changes logged, their bytes, and the bytes the persist stored
    changes: int = 0
    logged_bytes: int = 0
    persisted_bytes: int = 0
    #: the local store's size after the batch
    state_bytes: int = 0
    key_groups_touched: int = 0
    lock_s: float = 0.0
    open_s: float = 0.0
    apply_s: float = 0.0
    persist_s: float = 0.0
    mat_wait_s: float = 0.0
    local_commit_s: float = 0.0
    task_s: float = 0.0
    #: the store was emptied (no checkpoint yet, but a stale store was found)
    reset: bool = False
    #: the store was rebuilt from the committed checkpoint
    restored: bool = False
    restore_s: float = 0.0
    restore_rows: int = 0
    restore_replayed: int = 0
    restore_bytes: int = 0
    #: the attempt created a new changelog writer (first run, or the old log was gone)
    new_writer: bool = False
    #: the log id of a writer the attempt gave up (see ``Subtask.close``)
    abandoned_log: str = ""
    #: the changelog was truncated below this SQN in this attempt (0: not)
    truncated_before: int = 0
    mat_s: float = 0.0
    mat_bytes: int = 0
    mat_kgs: int = 0
    mat_dirty_kgs: int = 0
    #: the engine's attempt number of the task (Spark: ``TaskContext.attemptNumber``)
    task_attempt: int = 0

    def to_json(self) -> dict[str, Any]:
        return flat_to_json(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> TaskStats:
        return flat_from_json(cls, doc)


class TaskFigures(Protocol):
    """What :meth:`CheckpointStats.of_tasks` reads of one task's result (a ``TaskResult``)."""

    @property
    def stats(self) -> TaskStats: ...

    @property
    def mat_error(self) -> str: ...


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """Figures of one checkpoint (one micro-batch); durations in seconds.

    Sums and peaks over the batch's tasks, the sizes of its record, and what
    the driver measured after writing it. A record carries the figures known
    when it was written (``record_s``, ``checkpoint_s``, ``discarded_objects``
    and ``batch_s`` only in the coordinator's ``history``).
    """

    batch_id: int = -1
    #: a materialization round completed with this batch (every subtask's part recorded)
    materialized: bool = False
    # sums over the tasks
    rows: int = 0
    keys: int = 0
    changes: int = 0
    logged_bytes: int = 0
    persisted_bytes: int = 0
    state_bytes: int = 0
    mat_bytes: int = 0
    mat_kgs: int = 0
    restored_subtasks: int = 0
    # peaks over the tasks
    persist_max_s: float = 0.0
    apply_max_s: float = 0.0
    task_max_s: float = 0.0
    mat_max_s: float = 0.0
    restore_max_s: float = 0.0
    max_task_attempt: int = 0
    #: the first materialization errors of the batch's tasks
    mat_errors: tuple[str, ...] = ()
    # the record
    segments: int = 0
    parts: int = 0
    #: bytes the record refers to (parts + changelog)
    checkpoint_size_bytes: int = 0
    # measured by the driver
    record_s: float = 0.0
    #: slowest task's persist plus writing the record
    checkpoint_s: float = 0.0
    discarded_objects: int = 0
    #: wall time of the whole batch, when the caller measured it
    batch_s: float | None = None

    @classmethod
    def of_tasks(
        cls, batch_id: int, materialized: bool, results: Sequence[TaskFigures]
    ) -> CheckpointStats:
        """The sums and peaks over one batch's task results."""
        ts = [r.stats for r in results]
        errors = tuple(r.mat_error for r in results if r.mat_error)
        return cls(
            batch_id=batch_id,
            materialized=materialized and not errors,
            rows=sum(s.rows for s in ts),
            keys=sum(s.keys for s in ts),
            changes=sum(s.changes for s in ts),
            logged_bytes=sum(s.logged_bytes for s in ts),
            persisted_bytes=sum(s.persisted_bytes for s in ts),
            state_bytes=sum(s.state_bytes for s in ts),
            mat_bytes=sum(s.mat_bytes for s in ts),
            mat_kgs=sum(s.mat_kgs for s in ts),
            restored_subtasks=sum(1 for s in ts if s.restored),
            persist_max_s=_r(max((s.persist_s for s in ts), default=0.0)),
            apply_max_s=_r(max((s.apply_s for s in ts), default=0.0)),
            task_max_s=_r(max((s.task_s for s in ts), default=0.0)),
            mat_max_s=_r(max((s.mat_s for s in ts), default=0.0)),
            restore_max_s=_r(max((s.restore_s for s in ts), default=0.0)),
            max_task_attempt=max((s.task_attempt for s in ts), default=0),
            mat_errors=errors[:MAX_MAT_ERRORS],
        )

    def with_sizes(self, *, segments: int, parts: int, size_bytes: int) -> CheckpointStats:
        """With the sizes of the batch's record (:meth:`.records.CheckpointRecord.sized`)."""
        return replace(self, segments=segments, parts=parts, checkpoint_size_bytes=size_bytes)

    def completed(
        self, *, record_s: float, discarded_objects: int, batch_s: float | None
    ) -> CheckpointStats:
        """With what the driver measured once the record was written."""
        return replace(
            self,
            record_s=_r(record_s),
            checkpoint_s=_r(self.persist_max_s + record_s),
            discarded_objects=discarded_objects,
            batch_s=None if batch_s is None else _r(batch_s),
        )

    def describe(self) -> str:
        """One log line."""
        mat = (
            f", materialized {self.mat_bytes} B in {self.mat_max_s:.3f}s"
            if self.materialized
            else ""
        )
        return (
            f"checkpoint {self.batch_id}: {self.rows} rows, persisted {self.persisted_bytes} B "
            f"in {self.checkpoint_s:.3f}s (record {self.record_s:.3f}s), "
            f"state {self.state_bytes} B{mat}"
        )

    def to_json(self) -> dict[str, Any]:
        return flat_to_json(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> CheckpointStats:
        return flat_from_json(cls, doc)
