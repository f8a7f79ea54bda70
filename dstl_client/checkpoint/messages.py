"""What the driver and the tasks of a keyed operator tell each other (the only place).

* :class:`BatchPlan`: the driver to every task of one batch (in Spark it
  travels pickled in the closure of the batch's ``mapInArrow`` function).
* :class:`TaskResult`: one task to the driver (JSON bytes in the task's
  result row), with its :class:`MatResult` and its
  :class:`~dstl_client.checkpoint.stats.TaskStats`.

All of them are frozen: a message is built once and never changed, so the
driver and the task never share mutable state. They are plain data, safe to
use from any thread.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from dstl_client.checkpoint.codec import (
    handle_from_text,
    handle_to_text,
)
from dstl_client.checkpoint.records import NO_BATCH, CheckpointRecord
from dstl_client.checkpoint.stats import TaskStats
from dstl_client.core.errors import InvalidArgument
from dstl_client.core.handle import ChangelogHandle
from dstl_client.keygroups import KeyGroupRange

#: cached rows of a task's state backend before dirty ones are spilled into its store
DEFAULT_CACHE_ROWS = 500_000
#: how a task reports a materialization whose process exited before it ended (the
#: driver then lets the next round's tasks wait for theirs: see ``MaterializationSchedule``)
MAT_PROCESS_EXITED = "the materialization's process exited before it finished"
#: how a task reports a round that is not materializing in its node's store: the task that
#: started it ran on another node (Spark placed the subtask elsewhere this batch), or the
#: store was rebuilt since (the driver reacts as to :data:`MAT_PROCESS_EXITED`)
MAT_NOT_HERE = "the round is not materializing in this node's store"


class MatFailure(enum.Enum):
    """Why a subtask's materialization round ended without a result (with ``mat_error``,
    which says it in words). The driver reacts to the kind, never to the words."""

    #: the upload raised (the sidecar, the store, the snapshot)
    ERROR = "error"
    #: it could not start in this store (its snapshot reader, its thread)
    NOT_STARTED = "not_started"
    #: a materialization of another round still runs in this store
    BUSY = "busy"
    #: its process exited before it finished (:data:`MAT_PROCESS_EXITED`)
    PROCESS_EXITED = "process_exited"
    #: the round is not materializing in this node's store (:data:`MAT_NOT_HERE`)
    NOT_HERE = "not_here"

    @property
    def lost(self) -> bool:
        """The upload did not finish where it started: the next rounds' tasks wait for theirs."""
        return self in (MatFailure.PROCESS_EXITED, MatFailure.NOT_HERE)

    @classmethod
    def of(cls, value: object, error: str) -> MatFailure | None:
        """The kind a report's JSON names; ``None`` without an error (a report from before the
        kinds, with one: :attr:`ERROR`)."""
        if not error:
            return None
        return cls(value) if value else cls.ERROR


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What the driver tells every task of one batch."""

    job_id: str
    operator_id: str
    batch_id: int
    parallelism: int
    max_parallelism: int
    state_dir: str
    #: the last committed checkpoint (``None`` before the first one)
    committed: CheckpointRecord | None
    #: sidecar address; a task prefers ``$DSTL_ADDRESS`` of its node
    dstl_address: str | None = None
    dstl_token: str | None = None
    #: start the materialization of ``committed`` (the round ``mat_round``) where none runs
    materialize: bool = False
    #: the materialization round the driver waits for (a committed batch id), or ``NO_BATCH``
    mat_round: int = NO_BATCH
    #: that round's id, unique per round and driver run: a slot's outcome counts only for
    #: the round that started it (not for an earlier driver's round of the same batch)
    mat_round_id: str = ""
    #: how long a task's finish waits for a materialization it started (0: never holds a batch)
    materialization_wait_s: float = 0.0
    #: baseline mode: materialize every key group, changed or not
    full_snapshot: bool = False
    persist_timeout_s: float = 120.0
    cache_rows: int = DEFAULT_CACHE_ROWS

    @property
    def committed_batch(self) -> int:
        return NO_BATCH if self.committed is None else self.committed.batch_id


@dataclass(frozen=True, slots=True)
class MatResult:
    """What one subtask materialized: its state as of ``batch``.

    ``uploaded`` key groups are in ``part``; ``cleared`` ones changed and are
    now empty; the others of the range did not change and are re-referenced.
    """

    batch: int
    part: ChangelogHandle | None
    uploaded: tuple[int, ...]
    cleared: tuple[int, ...]
    full: bool = False

    @property
    def part_id(self) -> str | None:
        return None if self.part is None else self.part.log_id

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "part": None if self.part is None else handle_to_text(self.part),
            "uploaded": list(self.uploaded),
            "cleared": list(self.cleared),
            "full": self.full,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> MatResult:
        return cls(
            int(doc["batch"]),
            None if doc["part"] is None else handle_from_text(doc["part"]),
            tuple(int(kg) for kg in doc["uploaded"]),
            tuple(int(kg) for kg in doc["cleared"]),
            bool(doc.get("full", False)),
        )


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What one subtask reports for one batch (travels as JSON bytes)."""

    index: int
    first: int
    last: int
    batch_id: int
    attempt: str
    changelog: ChangelogHandle | None
    mat: MatResult | None = None
    mat_error: str = ""
    #: why the round ended without ``mat`` (set with ``mat_error``)
    mat_failure: MatFailure | None = None
    #: the materialization round ``mat`` / ``mat_error`` report on (``NO_BATCH``: none)
    mat_batch: int = NO_BATCH
    stats: TaskStats = field(default_factory=TaskStats)
    #: the log id of the subtask's changelog writer (the driver closes it on stop)
    log_id: str = ""
    #: the snapshot of its operator lists, if it wrote one this batch
    op_state: ChangelogHandle | None = None

    @property
    def kg_range(self) -> KeyGroupRange:
        return KeyGroupRange(self.first, self.last)

    def object_keys(self) -> set[str]:
        keys: set[str] = set()
        if self.changelog is not None:
            keys.update(self.changelog.object_keys)
        if self.mat is not None and self.mat.part is not None:
            keys.update(self.mat.part.object_keys)
        if self.op_state is not None:
            keys.update(self.op_state.object_keys)
        return keys

    def to_bytes(self) -> bytes:
        doc = {
            "index": self.index,
            "first": self.first,
            "last": self.last,
            "batch_id": self.batch_id,
            "attempt": self.attempt,
            "changelog": None if self.changelog is None else handle_to_text(self.changelog),
            "mat": None if self.mat is None else self.mat.to_json(),
            "mat_error": self.mat_error,
            "mat_failure": None if self.mat_failure is None else self.mat_failure.value,
            "mat_batch": self.mat_batch,
            "stats": self.stats.to_json(),
            "log_id": self.log_id,
            "op_state": None if self.op_state is None else handle_to_text(self.op_state),
        }
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> TaskResult:
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise InvalidArgument(f"task result is not JSON: {exc}") from None
        m = doc.get("mat")
        return cls(
            index=int(doc["index"]),
            first=int(doc["first"]),
            last=int(doc["last"]),
            batch_id=int(doc["batch_id"]),
            attempt=str(doc["attempt"]),
            changelog=None if doc["changelog"] is None else handle_from_text(doc["changelog"]),
            mat=None if m is None else MatResult.from_json(m),
            mat_error=str(doc.get("mat_error") or ""),
            mat_failure=MatFailure.of(doc.get("mat_failure"), str(doc.get("mat_error") or "")),
            mat_batch=int(doc.get("mat_batch", NO_BATCH)),
            stats=TaskStats.from_json(doc.get("stats")),
            log_id=str(doc.get("log_id") or ""),
            op_state=None if not doc.get("op_state") else handle_from_text(doc["op_state"]),
        )
