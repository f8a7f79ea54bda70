"""Planning a batch and judging its tasks' results: the plan, completeness, materialization.

Materialization is time-driven: when ``materialize_interval_s`` has passed
since the last one completed (or, with ``materialize_tail_ratio``, once the
changelog a restore would replay outgrew that share of the materialized
state and ``materialize_tail_min_bytes``: :func:`tail_outgrew`), the next
plan starts a round, which runs in the background across batches (see :class:`MaterializationSchedule`; at most one
at a time). A round that failed in some subtask counts as a failure; after
``max_materialization_failures`` in a row the job stops with
:class:`MaterializationFailed` (after the batch's checkpoint was recorded: it
is complete without the materialization).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.checkpoint.records import NO_BATCH, CheckpointRecord
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.core.errors import DstlError
from dstl_client.keygroups import key_group_range_for_operator

log = logging.getLogger(__name__)


class MaterializationFailed(DstlError):
    """Materialization failed too many times in a row; the job stops."""

    grpc_code = "UNAVAILABLE"
    kind = "materialization_failed"


class IncompleteBatch(DstlError):
    """Task results do not cover every subtask exactly once."""

    kind = "incomplete_batch"


def make_plan(
    config: CoordinatorConfig,
    batch_id: int,
    parallelism: int,
    latest: CheckpointRecord | None,
    *,
    materialize: bool,
    mat_round: int = NO_BATCH,
    mat_round_id: str = "",
    materialization_wait_s: float | None = None,
) -> BatchPlan:
    """The plan every task of ``batch_id`` gets (``latest``: the last recorded checkpoint)."""
    return BatchPlan(
        job_id=config.job_id,
        operator_id=config.operator_id,
        batch_id=batch_id,
        parallelism=parallelism,
        max_parallelism=config.max_parallelism,
        state_dir=config.state_dir,
        committed=None if latest is None else latest.for_tasks(),
        dstl_address=config.dstl_address or None,
        dstl_token=config.dstl_token,
        materialize=latest is not None and materialize,
        mat_round=mat_round if latest is not None else NO_BATCH,
        mat_round_id=mat_round_id if latest is not None else "",
        materialization_wait_s=(
            config.materialization_wait_s
            if materialization_wait_s is None
            else materialization_wait_s
        ),
        full_snapshot=config.full_snapshot,
        persist_timeout_s=min(config.persist_timeout_s, config.checkpoint_timeout_s),
        cache_rows=config.cache_rows,
    )


def check_results(plan: BatchPlan, results: Sequence[TaskResult]) -> None:
    """:class:`IncompleteBatch` unless there is one result per subtask of the plan."""
    seen: set[int] = set()
    for r in results:
        if r.batch_id != plan.batch_id:
            raise IncompleteBatch(f"result of batch {r.batch_id} in batch {plan.batch_id}")
        if r.index in seen:
            raise IncompleteBatch(f"two results for subtask {r.index}")
        rng = key_group_range_for_operator(r.index, plan.parallelism, plan.max_parallelism)
        if (r.first, r.last) != rng.as_tuple():
            raise IncompleteBatch(f"subtask {r.index} reports range [{r.first}, {r.last}]")
        seen.add(r.index)
    missing = sorted(set(range(plan.parallelism)) - seen)
    if missing:
        raise IncompleteBatch(f"batch {plan.batch_id}: no result from subtasks {missing}")


@dataclass(slots=True)
class MatRound:
    """One materialization round: version ``batch`` of every subtask at ``parallelism``."""

    batch: int
    parallelism: int
    started: float
    #: unique per round and driver run (what tasks match their slot's record against)
    round_id: str
    #: subtasks that have not reported their outcome yet
    pending: set[int]
    #: the errors reported so far (``subtask i: ...``)
    errors: list[str] = field(default_factory=list)
    #: those of uploads lost on the way (:attr:`~.messages.MatFailure.lost`)
    lost: list[str] = field(default_factory=list)
    #: the slowest subtask's upload so far (s), and the bytes uploaded by all
    max_s: float = 0.0
    bytes: int = 0


def tail_bytes(record: CheckpointRecord) -> int:
    """The stored bytes of the changelog a restore from ``record`` replays (its segments)."""
    return sum(seg.handle.stored_bytes for seg in record.segments)


def tail_share(record: CheckpointRecord) -> float:
    """The changelog a restore from ``record`` replays, as a share of what it loads.

    Both in stored bytes: the record's segments over its parts (``inf`` with
    a tail and nothing materialized yet; 0 without a tail).
    """
    tail = tail_bytes(record)
    if tail == 0:
        return 0.0
    base = sum(h.stored_bytes for h in record.parts.values())
    return tail / base if base > 0 else float("inf")


def tail_outgrew(record: CheckpointRecord | None, ratio: float, min_bytes: int = 0) -> bool:
    """Whether ``record``'s changelog tail is over ``ratio`` times its materialized state.

    Both in stored bytes (:func:`tail_share`): the segments a restore from the
    record replays against the parts it loads. ``ratio`` 0: never (by time
    only); a tail under ``min_bytes``: not yet. With no materialization yet,
    any tail (of ``min_bytes`` or more) is over.
    """
    if record is None or ratio <= 0 or not record.segments:
        return False
    return tail_bytes(record) >= min_bytes and tail_share(record) > ratio


def tail_due(record: CheckpointRecord | None, config: CoordinatorConfig) -> bool:
    """:func:`tail_outgrew` with the job's ``materialize_tail_ratio`` and ``_min_bytes``."""
    return tail_outgrew(record, config.materialize_tail_ratio, config.materialize_tail_min_bytes)


class MaterializationSchedule:
    """When the next materialization round is due, the one in flight, and failures in a row.

    A round materializes version ``C`` (the latest record when it starts) of
    every subtask, in the background across batches (as in Flink's FLIP-158).
    Plans ask the tasks to start it (``materialize``) while ``C`` is still the
    latest record, and name it (``mat_round``) until every subtask reported
    its outcome. It ends when they all did: completed if none failed, else
    failed; it also fails when still unfinished ``timeout_s`` after its start,
    and a rescale abandons it (neither). The next round is due
    ``interval_s`` after the last completed one (or the start).

    Invariants: at most one round at a time, each with an id of its own (a
    new driver's round of the same batch is another round: the outcomes of the
    old one, whose objects the new driver's orphan sweep may have deleted, are
    never taken); a task's report is accepted only for the round in flight
    (batch and id), at its parallelism, once per subtask (anything
    else is dropped from the results, so its part never enters a record and
    its objects are orphans for the sweep); the failure count is the number of
    consecutive rounds that failed, reset by one that completed.

    A materialization runs on a thread of the Python worker that started it;
    Spark stops workers that stay idle (about a minute without tasks), which
    takes the upload along (``MatFailure.PROCESS_EXITED``), and may run the
    subtask's next task on another node, whose store is not materializing the
    round (``MatFailure.NOT_HERE``). After a round failed either way, the next
    rounds' tasks wait for their own upload (up to ``timeout_s``: the batch
    holds, as a synchronous materialization would) until one completes, so
    slow triggers, large state and subtasks that change nodes still
    materialize.

    Thread: the coordinator's, under its lock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last_done = clock()
        self.failures = 0
        self.round: MatRound | None = None
        #: the last round that ended (its figures)
        self.last_round: MatRound | None = None
        self.last_errors: list[str] = []
        #: the last round failed because an upload was lost (``MatFailure.lost``): tasks wait
        self.synchronous = False

    def wait_s(self, configured_s: float, timeout_s: float) -> float:
        """How long the next plan's tasks wait for a materialization they started."""
        return max(configured_s, timeout_s) if self.synchronous else configured_s

    def restart(self) -> None:
        """The interval counts from now (the coordinator's start); no round in flight."""
        self._last_done = self._clock()
        self.round = None

    def due(self, interval_s: float, tail_due: bool = False) -> bool:
        """No round in flight and ``interval_s`` passed since the last one, or ``tail_due``."""
        if self.round is not None:
            return False
        return tail_due or self._clock() - self._last_done >= interval_s

    def plan(
        self,
        latest_batch: int | None,
        parallelism: int,
        interval_s: float,
        timeout_s: float,
        tail_due: bool = False,
    ) -> tuple[bool, int]:
        """``(materialize, mat_round)`` for the next plan; starts a round when one is due.

        ``tail_due``: the latest record's changelog tail outgrew the
        materialized state (:func:`tail_outgrew`): a round starts whatever
        the interval.
        """
        now = self._clock()
        r = self.round
        if r is not None and r.parallelism != parallelism:
            log.info("materialization of batch %d abandoned: the job rescaled", r.batch)
            self.round = None
        elif r is not None and now - r.started > timeout_s:
            missing = sorted(r.pending)
            self._end(
                [*r.errors, f"subtasks {missing}: not finished {timeout_s:g}s after it started"],
                r.lost,
            )
        if latest_batch is not None and self.due(interval_s, tail_due):
            self.round = MatRound(
                latest_batch, parallelism, now, uuid.uuid4().hex, set(range(parallelism))
            )
        r = self.round
        if r is None:
            return False, NO_BATCH
        return latest_batch == r.batch, r.batch

    @property
    def round_id(self) -> str:
        """The id of the round in flight ("" if none), for the next plan."""
        return "" if self.round is None else self.round.round_id

    def accepted(self, plan: BatchPlan, results: Sequence[TaskResult]) -> list[TaskResult]:
        """The results with only the reports this round takes (others dropped)."""
        r = self.round
        out = []
        for res in results:
            takes = (
                r is not None
                and plan.mat_round == r.batch == res.mat_batch
                and plan.mat_round_id == r.round_id
                and plan.parallelism == r.parallelism
                and res.index in r.pending
            )
            if not takes and (res.mat is not None or res.mat_error):
                res = replace(res, mat=None, mat_error="", mat_failure=None, mat_batch=NO_BATCH)
            out.append(res)
        return out

    def would_complete(self, results: Sequence[TaskResult]) -> bool:
        """Whether recording these (accepted) results completes the round without a failure."""
        r = self.round
        if r is None or r.errors or any(res.mat_error for res in results):
            return False
        reported = {res.index for res in results if res.mat is not None}
        return not (r.pending - reported)

    def completed(self, results: Sequence[TaskResult]) -> bool | None:
        """Count the recorded (accepted) results: ``None`` unless the round ended, else success."""
        r = self.round
        if r is None:
            return None
        for res in results:
            if res.mat_error:
                r.errors.append(f"subtask {res.index}: {res.mat_error}")
                if res.mat_failure is not None and res.mat_failure.lost:
                    r.lost.append(r.errors[-1])
            if res.mat is not None or res.mat_error:
                r.pending.discard(res.index)
                r.max_s = max(r.max_s, res.stats.mat_s)
                r.bytes += res.stats.mat_bytes
        if r.pending:
            return None
        return self._end(r.errors, r.lost)

    def _end(self, errors: list[str], lost: list[str]) -> bool:
        self.last_round, self.round = self.round, None
        if errors:
            self.failures += 1
            self.last_errors = errors
            if lost and not self.synchronous:
                self.synchronous = True
                log.warning(
                    "a materialization did not finish where it started (%s); the next ones "
                    "run inside their batch until one completes",
                    lost[0],
                )
            return False
        self.synchronous = False
        self.failures = 0
        self.last_errors = []
        self._last_done = self._clock()
        return True

    def raise_if_exhausted(self, max_failures: int) -> None:
        """:class:`MaterializationFailed` after ``max_failures`` failed rounds in a row."""
        if self.failures >= max_failures and self.last_errors:
            errors = "; ".join(self.last_errors[:3])
            raise MaterializationFailed(
                f"materialization failed {self.failures} times in a row "
                f"(max_materialization_failures={max_failures}); last errors: {errors}"
            )
