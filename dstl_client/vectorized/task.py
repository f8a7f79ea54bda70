"""The executor side of a vectorized query: one partition of one batch (``mapInArrow``).

Rows arrive routed by key group (:mod:`dstl_client.batch.routing`) with the
driver's key-group column (:data:`~.keys.KG_COLUMN`) and one marker row per
partition. The task drops the markers and the late rows (or counts them
through, as :mod:`dstl_client.processor.task` does), runs
:func:`~.runner.run_batch` (one call of the user's function) and returns
the output rows, then the result row (checkpoint result, and the task's
:class:`~dstl_client.processor.stats.ProcessorStats` in ``EXTRA_COLUMN``).

Invariant: output rows are handed to Spark only after the batch's state is
durable and committed locally. Runs on a Spark task thread of a Python worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.batch.columns import MARKER_COLUMN, output_batch, result_batch
from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.processor.late_rows import split_late_rows
from dstl_client.processor.times import BatchTimes
from dstl_client.vectorized.keys import KG_COLUMN
from dstl_client.vectorized.runner import run_batch
from dstl_client.vectorized.spec import VectorSpec

#: output rows per Arrow batch returned by a task
_OUT_BATCH_ROWS = 65_536


def vector_task(
    spec: VectorSpec,
    fn: bytes,
    plan: BatchPlan,
    times: BatchTimes,
    out_schema: Any,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """One partition of one batch on an executor (the ``mapInArrow`` function);
    ``fn`` is the user's function, pickled (cloudpickle)."""
    from pyspark import TaskContext, cloudpickle

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - always set inside a task
        raise RuntimeError("not inside a Spark task")
    wanted = [*spec.input_schema.names, KG_COLUMN]
    parts = []
    for rb in batches:
        if rb.num_rows == 0:
            continue
        rb = rb.filter(pc.invert(rb.column(MARKER_COLUMN)))
        if rb.num_rows:
            parts.append(rb.select(wanted))
    table = pa.Table.from_batches(parts) if parts else None
    table, late_dropped, late_passed = split_late_rows(
        table, spec.event_time_column, times, spec.late_rows
    )
    run = run_batch(plan, ctx.partitionId(), spec, cloudpickle.loads(fn), table, times)
    result = replace(run.result, stats=replace(run.result.stats, task_attempt=ctx.attemptNumber()))
    output = run.output
    for rb in output.to_batches(max_chunksize=_OUT_BATCH_ROWS):
        yield output_batch(rb.columns, out_schema)
    stats = replace(run.stats, late_rows_dropped=late_dropped, late_rows_passed=late_passed)
    yield result_batch(result.to_bytes(), stats.to_bytes(), out_schema)
