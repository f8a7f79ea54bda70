"""The executor side of a keyed query: one partition of one batch (``mapInArrow``).

Rows arrive routed by key group (``repartitionById``) plus one marker row per
partition, so every subtask runs even without data. The partition's rows are
grouped by key, run through :func:`~dstl_client.state.subtask.run_keyed`,
and come back as Arrow batches: the user's output rows, then one result row
carrying the :class:`~dstl_client.checkpoint.messages.TaskResult`
(:mod:`dstl_client.batch.columns`).

Invariant: output rows are converted and handed to Spark only after the
batch's changes are durable at the sidecar and committed locally, so no
output of an attempt escapes before its state is safe. Runs on a Spark task
thread of a Python worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from dstl_client.batch.columns import MARKER_COLUMN, output_batch, result_batch, user_arrow_fields
from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.state.subtask import KeyedFunction, run_keyed

#: output rows per Arrow batch returned by a task
_OUT_BATCH_ROWS = 10_000


def _group_by_key(batches: Iterator[Any], key: str, columns: list[str]) -> dict[Any, list[Any]]:
    groups: dict[Any, list[dict[str, Any]]] = {}
    for rb in batches:
        if rb.num_rows == 0:
            continue
        marker = rb.column(MARKER_COLUMN).to_pylist()
        data = rb.select(columns).to_pylist()
        for is_marker, row in zip(marker, data, strict=True):
            if is_marker:
                continue
            k = row[key]
            rows = groups.get(k)
            if rows is None:
                groups[k] = [row]
            else:
                rows.append(row)
    return groups


def keyed_task(
    plan: BatchPlan,
    key: str,
    fn: KeyedFunction,
    columns: list[str],
    out_schema: Any,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """One partition of one batch on an executor (the ``mapInArrow`` function)."""
    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - always set inside a task
        raise RuntimeError("not inside a Spark task")
    groups = _group_by_key(batches, key, columns)
    outputs: list[Any] = []
    user_fields = user_arrow_fields(out_schema)
    # without an output schema the function's rows have nowhere to go
    emit = outputs.append if user_fields else None
    result = run_keyed(plan, ctx.partitionId(), groups.items(), fn, emit=emit)
    result = replace(result, stats=replace(result.stats, task_attempt=ctx.attemptNumber()))
    names = [f.name for f in user_fields]
    for start in range(0, len(outputs), _OUT_BATCH_ROWS):
        chunk = outputs[start : start + _OUT_BATCH_ROWS]
        if isinstance(chunk[0], dict):
            cols = [[row.get(n) for row in chunk] for n in names]
        else:
            cols = [list(c) for c in zip(*chunk, strict=True)]
        arrays = [pa.array(c, type=f.type) for c, f in zip(cols, user_fields, strict=True)]
        yield output_batch(arrays, out_schema)
    yield result_batch(result.to_bytes(), None, out_schema)
