"""The executor side of a processor query: one partition of one batch (``mapInArrow``).

Rows arrive routed by key group (:mod:`dstl_client.batch.routing`), with
one marker row per partition and, in the first batch, the initial state rows
(in :data:`INIT_COLUMN`). The task drops late rows (or counts them through),
groups the rest by key into pandas DataFrames (``transformWithStateInPandas``
style) or ``Row``\\ s (``transformWithState`` style), runs
:func:`~.runner.run_processor` and converts what the processor returned back
to Arrow: the output rows, then the result row (checkpoint result, and the
task's :class:`~.stats.ProcessorStats` in ``EXTRA_COLUMN``).

Invariant: outputs are converted and handed to Spark only after the batch's
state is durable and committed locally. A fresh processor instance per task
(unpickled from the spec). Runs on a Spark task thread of a Python worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from dstl_client.batch.columns import MARKER_COLUMN, result_batch, user_arrow_fields
from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.processor.frames import (
    PandasConf,
    key_positions,
    output_batches,
    pandas_frames,
    spark_rows,
)
from dstl_client.processor.late_rows import split_late_rows
from dstl_client.processor.runner import ProcessorTask, run_processor
from dstl_client.processor.stats import ProcessorStats
from dstl_client.processor.times import BatchTimes

#: the initial state of a row (a struct of the initial state's columns), first batch only
INIT_COLUMN = "__dstl_init"


@dataclass(frozen=True, slots=True)
class ProcessorTaskSpec:
    """What every task of a processor query needs (pickled into the batch's function).

    Frozen: built on the driver, read by every task.
    """

    #: the processor, pickled (cloudpickle): each task unpickles its own instance
    processor: bytes
    #: the grouping key column
    key: str
    #: the input columns the processor sees
    columns: tuple[str, ...]
    how: ProcessorTask
    #: pandas DataFrames in and out (else Rows)
    use_pandas: bool = True
    #: the input's event-time column (``withWatermark``) for late rows, if any
    event_time_column: str | None = None
    #: ``"drop"`` late rows (Spark's behaviour) or ``"pass"`` them to the processor
    late_rows: str = "drop"
    #: Spark's session time zone (pandas timestamps are naive local times in it)
    timezone: str = "UTC"
    #: how pandas frames are built (Spark's settings; the time zone above wins)
    pandas_conf: PandasConf | None = None
    #: the initial state's columns (in ``INIT_COLUMN``), if the query has one
    initial_columns: tuple[str, ...] | None = None

    @property
    def pandas(self) -> PandasConf:
        """The pandas conversion settings, in the session's time zone."""
        conf = self.pandas_conf or PandasConf()
        return replace(conf, timezone=self.timezone)


def processor_task(
    spec: ProcessorTaskSpec,
    plan: BatchPlan,
    times: BatchTimes,
    out_schema: Any,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """One partition of one batch on an executor (the ``mapInArrow`` function)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext, cloudpickle

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - always set inside a task
        raise RuntimeError("not inside a Spark task")
    wanted = list(spec.columns)
    if spec.initial_columns is not None:
        wanted.append(INIT_COLUMN)
    parts = []
    for rb in batches:
        if rb.num_rows == 0:
            continue
        rb = rb.filter(pc.invert(rb.column(MARKER_COLUMN)))
        if rb.num_rows:
            parts.append(rb.select(wanted))
    table = pa.Table.from_batches(parts) if parts else None
    initial: list[tuple[Any, list[Any]]] = []
    if table is not None and spec.initial_columns is not None:
        is_init = pc.is_valid(table.column(INIT_COLUMN))
        initial = _initial_groups(spec, table.filter(is_init))
        table = table.filter(pc.invert(is_init)).drop_columns([INIT_COLUMN])
    table, late_dropped, late_passed = split_late_rows(
        table, spec.event_time_column, times, spec.late_rows
    )
    groups, n_rows = _input_groups(spec, table)
    outputs: list[Any] = []
    emit = outputs.append if user_arrow_fields(out_schema) else None
    processor = cloudpickle.loads(spec.processor)
    result, stats = run_processor(
        plan,
        ctx.partitionId(),
        processor,
        groups,
        how=spec.how,
        times=times,
        emit=emit,
        initial=initial,
        input_rows=n_rows,
    )
    result = replace(result, stats=replace(result.stats, task_attempt=ctx.attemptNumber()))
    out_rows = 0
    for batch in output_batches(
        outputs, out_schema, use_pandas=spec.use_pandas, timezone=spec.timezone
    ):
        out_rows += batch.num_rows
        yield batch
    stats = replace(
        stats, late_rows_dropped=late_dropped, late_rows_passed=late_passed, output_rows=out_rows
    )
    yield result_batch(result.to_bytes(), stats.to_bytes(), out_schema)


def _input_groups(spec: ProcessorTaskSpec, table: Any) -> tuple[Iterator[tuple[Any, Any]], int]:
    """``(key, rows)`` per key, rows as ``handleInputRows`` gets them (lazily built)."""
    if table is None or table.num_rows == 0:
        return iter(()), 0
    where = key_positions(table.column(spec.key).to_pylist())
    n = table.num_rows
    if spec.use_pandas:
        converted = spark_rows(table, spec.pandas)

        def frames() -> Iterator[tuple[Any, Any]]:
            for k, positions in where.items():
                yield k, pandas_frames(converted, positions)

        return frames(), n
    from pyspark.sql import Row

    make = Row(*table.column_names)
    cols = [table.column(c).to_pylist() for c in table.column_names]

    def rows() -> Iterator[tuple[Any, Any]]:
        for k, positions in where.items():
            yield k, iter([make(*(c[i] for c in cols)) for i in positions])

    return rows(), n


def _initial_groups(spec: ProcessorTaskSpec, table: Any) -> list[tuple[Any, list[Any]]]:
    """``(key, items)`` of the initial state: one DataFrame per key, or one Row per row."""
    import pyarrow as pa

    if table.num_rows == 0:
        return []
    assert spec.initial_columns is not None
    struct = table.column(INIT_COLUMN).combine_chunks()
    init = pa.Table.from_arrays(struct.flatten(), names=list(spec.initial_columns))
    where = key_positions(table.column(spec.key).to_pylist())
    if spec.use_pandas:
        rows = spark_rows(init, spec.pandas)
        return [(k, list(pandas_frames(rows, p))) for k, p in where.items()]
    from pyspark.sql import Row

    make = Row(*init.column_names)
    cols = [init.column(c).to_pylist() for c in init.column_names]
    return [(k, [make(*(c[i] for c in cols)) for i in p]) for k, p in where.items()]


def stats_of(extra: bytes | None) -> ProcessorStats:
    """A task's figures from its result row (empty ones if it sent none)."""
    return ProcessorStats() if extra is None else ProcessorStats.from_bytes(extra)
