"""Processor batches without Spark: the coordinator's plan/record cycle around ``run_processor``.

Rows are dicts with a ``"k"`` key; each subtask gets its keys' rows (as one
list per key, in arrival order), the batch's times come from an injected
clock, and each task unpickles nothing: a fresh processor from a factory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstl_client.batch.local import partition_rows
from dstl_client.checkpoint.messages import TaskResult
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.processor.runner import ProcessorTask, run_processor, string_key
from dstl_client.processor.stats import ProcessorStats
from dstl_client.processor.times import BatchTimes
from tests.dstl_client.state._jobs import make_coordinator


@dataclass
class BatchRun:
    """What one batch produced."""

    outputs: list[Any]
    results: list[TaskResult]
    stats: ProcessorStats


@dataclass
class ProcessorHarness:
    """Runs a processor's batches against a real sidecar (one subtask after the other)."""

    coordinator: CheckpointCoordinator
    make: Callable[[], Any]
    client: ChangelogClient
    time_mode: str = "ProcessingTime"
    parallelism: int = 2
    #: injected clock: the processing time of a batch (fixed per batch id, as Spark's
    #: offsets log fixes it, so a re-run batch has the time of its first run)
    clock: Callable[[int], int] = lambda batch_id: 1000 + 100 * batch_id
    #: the watermark of a batch (``-1``: none)
    watermark: Callable[[int], int] = lambda batch_id: -1
    initial: dict[str, list[Any]] = field(default_factory=dict)

    def times(self, batch_id: int) -> BatchTimes:
        wm = self.watermark(batch_id)
        return BatchTimes(processing_ms=self.clock(batch_id), watermark_ms=wm, late_watermark_ms=wm)

    def run_tasks(self, batch_id: int, rows: list[dict[str, Any]]) -> BatchRun | None:
        """Plan and run every subtask of a batch; nothing recorded (``None``: checkpointed)."""
        plan = self.coordinator.plan_batch(batch_id, self.parallelism)
        if plan is None:
            return None
        times = self.times(batch_id)
        how = ProcessorTask(time_mode=self.time_mode, key_of=string_key)
        outputs: list[Any] = []
        results: list[TaskResult] = []
        stats: list[ProcessorStats] = []
        parts = partition_rows(rows, lambda r: r["k"], plan.parallelism, plan.max_parallelism)
        inits = partition_rows(
            [(k, v) for k, vs in self.initial.items() for v in vs],
            lambda kv: kv[0],
            plan.parallelism,
            plan.max_parallelism,
        )
        for i, by_key in enumerate(parts):
            initial = [(k, [kv[1] for kv in kvs]) for k, kvs in inits[i].items()]
            result, st = run_processor(
                plan,
                i,
                self.make(),
                [(k, iter(list(rs))) for k, rs in by_key.items()],
                how=how,
                times=times,
                emit=outputs.append,
                initial=initial if plan.committed is None else [],
                input_rows=sum(len(rs) for rs in by_key.values()),
                client=self.client,
            )
            results.append(result)
            stats.append(st)
        self._plan = plan
        return BatchRun(outputs, results, ProcessorStats.total(stats))

    def run_batch(self, batch_id: int, rows: list[dict[str, Any]]) -> BatchRun | None:
        """Plan, run and record one batch."""
        run = self.run_tasks(batch_id, rows)
        if run is not None:
            self.coordinator.complete_batch(self._plan, run.results)
        return run


def coordinator(root: Path, address: str, job_id: str, **kw: Any) -> CheckpointCoordinator:
    return make_coordinator(root, address, job_id=job_id, **kw)
