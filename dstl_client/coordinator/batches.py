"""Planning a batch and judging its tasks' results: the plan, completeness, materialization.

Materialization is time-driven: when ``materialize_interval_s`` has passed
since the last one completed, the next plan carries the flag (so at most one
runs at a time). A batch whose materialization failed in some subtask counts
as a failure; after ``max_materialization_failures`` in a row the job stops
with :class:`MaterializationFailed` (after the batch's checkpoint was
recorded: it is complete without the materialization).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.messages import BatchPlan, TaskResult
from dstl_client.coordinator.records import CheckpointRecord
from dstl_client.core.errors import DstlError
from dstl_client.keygroups import key_group_range_for_operator


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


class MaterializationSchedule:
    """When the next materialization is due, and how many failed in a row.

    Invariants: a materialization is due once ``interval_s`` passed since the
    last one completed (or since the start); the failure count is the number
    of consecutive batches whose planned materialization failed, reset by one
    that completed.

    Thread: the coordinator's, under its lock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last_done = clock()
        self.failures = 0

    def restart(self) -> None:
        """The interval counts from now (the coordinator's start)."""
        self._last_done = self._clock()

    def due(self, interval_s: float) -> bool:
        return self._clock() - self._last_done >= interval_s

    def completed(self, plan: BatchPlan, results: Sequence[TaskResult]) -> bool | None:
        """Count the batch: ``None`` if it planned no materialization, else whether it completed."""
        if not plan.materialize:
            return None
        if any(r.mat_error for r in results):
            self.failures += 1
            return False
        self.failures = 0
        self._last_done = self._clock()
        return True

    def raise_if_exhausted(self, max_failures: int, results: Sequence[TaskResult]) -> None:
        """:class:`MaterializationFailed` after ``max_failures`` failures in a row."""
        failed = [r for r in results if r.mat_error]
        if failed and self.failures >= max_failures:
            errors = "; ".join(f"subtask {r.index}: {r.mat_error}" for r in failed[:3])
            raise MaterializationFailed(
                f"materialization failed {self.failures} times in a row "
                f"(max_materialization_failures={max_failures}); last errors: {errors}"
            )
