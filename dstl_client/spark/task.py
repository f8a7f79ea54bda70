"""The executor side of a keyed query: one partition of one batch (``mapInArrow``).

Rows arrive routed by key group (``repartitionById``) plus one marker row per
partition, so every subtask runs even without data. The partition's rows are
grouped by key, run through :func:`~dstl_client.state.subtask.run_keyed`,
and come back as Arrow batches: the user's output rows, then one result row
carrying the :class:`~dstl_client.checkpoint.messages.TaskResult` (and, in
``EXTRA_COLUMN``, what else a kind of task reports, e.g. a processor's figures).

Invariant: output rows are converted and handed to Spark only after the
batch's changes are durable at the sidecar and committed locally, so no
output of an attempt escapes before its state is safe. Runs on a Spark task
thread of a Python worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.state.subtask import KeyedFunction, run_keyed

META_COLUMN = "__dstl_meta"
#: more of a task's result row (bytes, or null): what a kind of task adds to its result
EXTRA_COLUMN = "__dstl_extra"
PART_COLUMN = "__dstl_part"
MARKER_COLUMN = "__dstl_marker"
RESERVED_COLUMNS = (META_COLUMN, EXTRA_COLUMN, PART_COLUMN, MARKER_COLUMN)
#: the columns a task's output has after the user's
RESULT_COLUMNS = (META_COLUMN, EXTRA_COLUMN)
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


def user_arrow_fields(out_schema: Any) -> list[Any]:
    """The user's fields of a task's Arrow output schema (the result columns left out)."""
    return [f for f in out_schema if f.name not in RESULT_COLUMNS]


def output_batch(arrays: list[Any], out_schema: Any) -> Any:
    """An Arrow batch of output rows: the user's columns, null result columns."""
    import pyarrow as pa

    n = len(arrays[0]) if arrays else 0
    tail = [pa.nulls(n, type=pa.binary()) for _ in RESULT_COLUMNS]
    return pa.RecordBatch.from_arrays([*arrays, *tail], schema=out_schema)


def result_batch(meta: bytes, extra: bytes | None, out_schema: Any) -> Any:
    """The task's result row: null user columns, its ``TaskResult`` and extra bytes."""
    import pyarrow as pa

    cols = [pa.nulls(1, type=f.type) for f in user_arrow_fields(out_schema)]
    cols.append(pa.array([meta], type=pa.binary()))
    cols.append(pa.array([extra], type=pa.binary()))
    return pa.RecordBatch.from_arrays(cols, schema=out_schema)
