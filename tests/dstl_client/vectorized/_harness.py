"""Vectorized batches without Spark: the coordinator's plan/record cycle around ``run_batch``.

Rows are dicts; each subtask gets its key groups' rows as one Arrow table
with the key-group column the driver's SQL would add; the batch's times come
from an injected clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from dstl_client.batch.local import partition_rows
from dstl_client.checkpoint.messages import TaskResult
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.keygroups import key_group_for_key
from dstl_client.processor.stats import ProcessorStats
from dstl_client.processor.times import BatchTimes
from dstl_client.vectorized.api import BatchFunction
from dstl_client.vectorized.keys import KG_COLUMN
from dstl_client.vectorized.runner import run_batch
from dstl_client.vectorized.spec import VectorSpec
from tests.dstl_client.state._jobs import make_coordinator

INPUT = pa.schema([("k", pa.int64()), ("v", pa.int64())])
COUNT_SUM = pa.schema([("count", pa.int64()), ("total", pa.int64())])
OUTPUT = pa.schema([("k", pa.int64()), ("count", pa.int64()), ("total", pa.int64())])


@dataclass
class BatchRun:
    output: pa.Table
    results: list[TaskResult]
    stats: ProcessorStats


@dataclass
class VectorHarness:
    """Runs a vectorized function's batches against a real sidecar (subtask after subtask)."""

    coordinator: CheckpointCoordinator
    fn: BatchFunction
    client: ChangelogClient
    spec: VectorSpec
    parallelism: int = 2
    clock: Callable[[int], int] = lambda batch_id: 1000 + 100 * batch_id
    watermark: Callable[[int], int] = lambda batch_id: -1

    def times(self, batch_id: int) -> BatchTimes:
        wm = self.watermark(batch_id)
        return BatchTimes(processing_ms=self.clock(batch_id), watermark_ms=wm, late_watermark_ms=wm)

    def run_batch(self, batch_id: int, rows: list[dict[str, Any]]) -> BatchRun | None:
        """Plan, run and record one batch (``None``: it was recorded already)."""
        plan = self.coordinator.plan_batch(batch_id, self.parallelism)
        if plan is None:
            return None
        key = self.spec.key
        parts = partition_rows(rows, lambda r: r[key], plan.parallelism, plan.max_parallelism)
        outputs, results, stats = [], [], []
        for i, by_key in enumerate(parts):
            flat = [r for rs in by_key.values() for r in rs]
            table = pa.Table.from_pylist(flat, schema=self.spec.input_schema)
            kgs = [key_group_for_key(r[key], plan.max_parallelism) for r in flat]
            table = table.append_column(KG_COLUMN, pa.array(kgs, pa.int32()))
            run = run_batch(
                plan, i, self.spec, self.fn, table, self.times(batch_id), client=self.client
            )
            outputs.append(run.output)
            results.append(run.result)
            stats.append(run.stats)
        self.coordinator.complete_batch(plan, results)
        return BatchRun(pa.concat_tables(outputs), results, ProcessorStats.total(stats))


def coordinator(root: Path, address: str, job_id: str, **kw: Any) -> CheckpointCoordinator:
    return make_coordinator(root, address, job_id=job_id, **kw)
