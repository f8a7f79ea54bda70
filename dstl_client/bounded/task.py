"""The executor side of sorted mode: one partition, sorted by key, streamed through a runner.

The partition's Arrow batches arrive sorted by key (then by event time, if
any; the initial state's rows of a key before its input). Runs of equal keys
are found with Arrow compute (no per-row Python to find them), a key whose
run continues into the next batch is carried over, and each finished key
goes to the runner of :mod:`.runner` at once: the partition is never held in
memory, only the current Arrow batch and the current key's rows. Outputs
leave in Arrow batches as they fill (no checkpoint to wait for).

Rows are what the streaming tasks hand over: dicts of the input columns for
``fn(key, rows, ctx)`` (:mod:`dstl_client.spark.task`), pandas DataFrames or
``Row``\\ s for a processor (:mod:`dstl_client.processor.task`, whose output
conversion is reused, so a processor's output converts alike in both modes).

Runs on a Spark task thread of a Python worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dstl_client.batch.columns import output_batch, user_arrow_fields
from dstl_client.bounded.runner import SortedKeyedRunner, SortedProcessorRunner
from dstl_client.processor.frames import output_batches, to_pandas
from dstl_client.processor.task import INIT_COLUMN
from dstl_client.state.subtask import KeyedFunction

#: output rows (``fn``) or output items (processor) buffered before an Arrow batch leaves
OUT_BATCH_ITEMS = 10_000


@dataclass(frozen=True, slots=True)
class BoundedTaskSpec:
    """What every task of a sorted-mode job needs (pickled into its function). Frozen."""

    #: the key column
    key: str
    #: the input columns the user sees, in order
    columns: tuple[str, ...]
    #: ``fn(key, rows, ctx)``, or ``None`` for a processor
    fn: KeyedFunction | None = None
    #: the processor, pickled (cloudpickle): each task unpickles its own instance
    processor: bytes | None = None
    time_mode: str = "None"
    #: the run's processing time (ms), fixed on the driver: the same in every task
    processing_ms: int = -1
    #: pandas DataFrames in and out (else Rows), for a processor
    use_pandas: bool = True
    #: Spark's session time zone (pandas timestamps are naive local times in it)
    timezone: str = "UTC"
    #: the initial state's columns (in ``INIT_COLUMN``), if there is one
    initial_columns: tuple[str, ...] | None = None
    #: the kind of the key column (``"string"`` or ``"integer"``)
    key_kind: str = "string"


# ------------------------------------------------------------------ key runs
def key_runs(rb: Any, key: str) -> list[tuple[int, int, Any]]:
    """``(start, end, key)`` of each run of equal keys in a batch (C speed, no row loop)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = rb.column(key)
    n = rb.num_rows
    if n == 0:
        return []
    if n == 1:
        return [(0, 1, col[0].as_py())]
    change = pc.not_equal(col.slice(1), col.slice(0, n - 1))
    starts = [0, *(pc.indices_nonzero(change).to_numpy() + 1).tolist()]
    keys = pc.take(col, pa.array(starts, pa.int64())).to_pylist()
    ends = [*starts[1:], n]
    return list(zip(starts, ends, keys, strict=True))


@dataclass(slots=True)
class _Piece:
    """Part of a key's rows in one batch: ``[start, end)`` of the converted batch,
    after ``init`` rows of the initial state (those come first in a key's run)."""

    batch: Any
    converted: Any
    start: int
    init: int
    end: int


_NOTHING: Any = object()


def key_pieces(
    batches: Iterator[Any],
    key: str,
    convert: Callable[[Any], Any],
    init_counts: Callable[[Any, list[tuple[int, int, Any]]], list[int]] | None = None,
) -> Iterator[tuple[Any, list[_Piece]]]:
    """``(key, pieces)`` per key in arrival order; a run crossing batches is one key.

    ``convert(batch)`` runs once per batch (rows, a DataFrame...); each piece
    refers to a slice of it. A key arriving again later is yielded again (the
    runner's order check refuses it).
    """
    current = _NOTHING
    pieces: list[_Piece] = []
    for rb in batches:
        if rb.num_rows == 0:
            continue
        runs = key_runs(rb, key)
        converted = convert(rb)
        inits = init_counts(rb, runs) if init_counts is not None else None
        for i, (start, end, k) in enumerate(runs):
            piece = _Piece(rb, converted, start, 0 if inits is None else inits[i], end)
            if current is not _NOTHING and k == current:
                pieces.append(piece)
                continue
            if current is not _NOTHING:
                yield current, pieces
            current, pieces = k, [piece]
    if current is not _NOTHING:
        yield current, pieces


# ----------------------------------------------------------------- fn(key, rows)
def _dict_rows(rb: Any, columns: list[str]) -> list[dict[str, Any]]:
    """A batch as dicts of ``columns`` (column-wise to Python, then zipped)."""
    values = [rb.column(c).to_pylist() for c in columns]
    if len(columns) == 1:
        name = columns[0]
        return [{name: v} for v in values[0]]
    return [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]


def _fn_output(outputs: list[Any], out_schema: Any) -> Any:
    """One Arrow batch of ``fn``'s output rows (tuples or dicts), as the streaming task."""
    import pyarrow as pa

    fields = user_arrow_fields(out_schema)
    if isinstance(outputs[0], dict):
        names = [f.name for f in fields]
        cols = [[row.get(n) for row in outputs] for n in names]
    else:
        cols = [list(c) for c in zip(*outputs, strict=True)]
    arrays = [pa.array(c, type=f.type) for c, f in zip(cols, fields, strict=True)]
    return output_batch(arrays, out_schema)


def _fn_task(spec: BoundedTaskSpec, out_schema: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """``fn`` per key: runs found in Arrow, rows as dicts sliced from the batch's list
    (the common case, a key within one batch, costs one list slice)."""
    assert spec.fn is not None
    columns = list(spec.columns)
    outputs: list[Any] = []
    emit = outputs.append if user_arrow_fields(out_schema) else None
    runner = SortedKeyedRunner(spec.fn, emit=emit)
    process = runner.process
    pending_key: Any = _NOTHING
    pending: list[Any] = []
    for rb in batches:
        if rb.num_rows == 0:
            continue
        rows = _dict_rows(rb, columns)
        for start, end, k in key_runs(rb, spec.key):
            if k == pending_key:  # the key's run goes on from the last batch
                pending.extend(rows[start:end])
                continue
            if pending_key is not _NOTHING:
                process(pending_key, pending)
            pending_key, pending = k, rows[start:end]
        if len(outputs) >= OUT_BATCH_ITEMS:
            yield _fn_output(outputs, out_schema)
            outputs.clear()
    if pending_key is not _NOTHING:
        process(pending_key, pending)
    if outputs:
        yield _fn_output(outputs, out_schema)


# ------------------------------------------------------------------ processor
def _init_counts(rb: Any, runs: list[tuple[int, int, Any]]) -> list[int]:
    """Rows of the initial state at the head of each run (they sort first in a key)."""
    import numpy as np
    import pyarrow.compute as pc

    valid = pc.is_valid(rb.column(INIT_COLUMN)).to_numpy(zero_copy_only=False)
    csum = np.concatenate(([0], np.cumsum(valid)))
    return [int(csum[e] - csum[s]) for s, e, _ in runs]


def _initial_items(spec: BoundedTaskSpec, pieces: list[_Piece]) -> list[Any]:
    """What ``handleInitialState`` gets for a key: one DataFrame, or one Row per row."""
    import pyarrow as pa

    slices = [p.batch.slice(p.start, p.init) for p in pieces if p.init]
    if not slices:
        return []
    assert spec.initial_columns is not None
    struct = pa.concat_arrays([s.column(INIT_COLUMN) for s in slices])
    init = pa.Table.from_arrays(struct.flatten(), names=list(spec.initial_columns))
    if spec.use_pandas:
        return [to_pandas(init, spec.timezone)]
    from pyspark.sql import Row

    make = Row(*init.column_names)
    cols = [init.column(c).to_pylist() for c in init.column_names]
    return [make(*vals) for vals in zip(*cols, strict=True)]


def _processor_task(
    spec: BoundedTaskSpec, out_schema: Any, batches: Iterator[Any]
) -> Iterator[Any]:
    from pyspark import cloudpickle

    assert spec.processor is not None
    columns = list(spec.columns)
    # the streaming task's output conversion, reused
    convert_out = functools.partial(
        output_batches, use_pandas=spec.use_pandas, timezone=spec.timezone
    )
    outputs: list[Any] = []
    emit = outputs.append if user_arrow_fields(out_schema) else None
    runner = SortedProcessorRunner(
        cloudpickle.loads(spec.processor),
        time_mode=spec.time_mode,
        processing_ms=spec.processing_ms,
        emit=emit,
    )
    convert: Callable[[Any], Any]
    if spec.use_pandas:

        def convert(rb: Any) -> Any:
            return to_pandas(rb.select(columns), spec.timezone)

        def rows_of(pieces: list[_Piece]) -> Iterator[Any]:
            return iter(
                [
                    p.converted.iloc[p.start + p.init : p.end].reset_index(drop=True)
                    for p in pieces
                    if p.end > p.start + p.init
                ]
            )

    else:
        from pyspark.sql import Row

        make = Row(*columns)

        def convert(rb: Any) -> Any:
            values = [rb.column(c).to_pylist() for c in columns]
            return [make(*row) for row in zip(*values, strict=True)]

        def rows_of(pieces: list[_Piece]) -> Iterator[Any]:
            return iter([r for p in pieces for r in p.converted[p.start + p.init : p.end]])

    init_counts = _init_counts if spec.initial_columns is not None else None
    runner.open()
    for k, pieces in key_pieces(batches, spec.key, convert, init_counts):
        has_input = any(p.end > p.start + p.init for p in pieces)
        initial = _initial_items(spec, pieces) if init_counts is not None else []
        runner.process(k, rows_of(pieces) if has_input else None, initial)
        if len(outputs) >= OUT_BATCH_ITEMS:
            yield from convert_out(outputs, out_schema)
            outputs.clear()
    runner.close()
    if outputs:
        yield from convert_out(outputs, out_schema)


def bounded_task(spec: BoundedTaskSpec, out_schema: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """One sorted partition on an executor (the ``mapInArrow`` function)."""
    if spec.processor is None:
        return _fn_task(spec, out_schema, batches)
    return _processor_task(spec, out_schema, batches)
