"""The columns a batch's tasks add to the user's rows, and the Arrow batches they return.

Every keyed API routes its rows the same way (one marker row per partition,
the partition number while routing) and its tasks answer the same way: the
user's output rows, then one result row carrying the
:class:`~dstl_client.checkpoint.messages.TaskResult` (``META_COLUMN``) and
what else a kind of task reports (``EXTRA_COLUMN``, e.g. a processor's
figures). Constants and pure functions: any thread (the Arrow batches are
built on a Spark task thread).
"""

from __future__ import annotations

from typing import Any

META_COLUMN = "__dstl_meta"
#: more of a task's result row (bytes, or null): what a kind of task adds to its result
EXTRA_COLUMN = "__dstl_extra"
PART_COLUMN = "__dstl_part"
MARKER_COLUMN = "__dstl_marker"
RESERVED_COLUMNS = (META_COLUMN, EXTRA_COLUMN, PART_COLUMN, MARKER_COLUMN)
#: the columns a task's output has after the user's
RESULT_COLUMNS = (META_COLUMN, EXTRA_COLUMN)


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
