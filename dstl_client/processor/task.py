"""The executor side of a processor query: one partition of one batch (``mapInArrow``).

Rows arrive routed by key group (as for :mod:`dstl_client.spark.task`), with
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

from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.core.errors import InvalidArgument
from dstl_client.processor.runner import ProcessorTask, run_processor
from dstl_client.processor.stats import ProcessorStats
from dstl_client.processor.times import BatchTimes
from dstl_client.spark.task import MARKER_COLUMN, output_batch, result_batch, user_arrow_fields

#: the initial state of a row (a struct of the initial state's columns), first batch only
INIT_COLUMN = "__dstl_init"
#: output rows per Arrow batch returned by a task
_OUT_BATCH_ROWS = 10_000
#: rows per input DataFrame of a key (``spark.sql.execution.arrow.maxRecordsPerBatch``'s default)
_MAX_RECORDS = 10_000


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


@dataclass(frozen=True, slots=True)
class PandasConf:
    """Spark's settings of the pandas conversion, with Spark's defaults. Frozen: any thread."""

    #: ``spark.sql.session.timeZone``
    timezone: str = "UTC"
    #: ``spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype``
    prefer_int_ext_dtype: bool = False

    @classmethod
    def of(cls, session: Any) -> PandasConf:
        """The settings of ``session`` (the driver)."""
        conf = session.conf
        prefer = conf.get("spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype", "false")
        return cls(
            timezone=conf.get("spark.sql.session.timeZone") or "UTC",
            prefer_int_ext_dtype=str(prefer).lower() == "true",
        )


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
    late_dropped = late_passed = 0
    if table is not None and spec.initial_columns is not None:
        is_init = pc.is_valid(table.column(INIT_COLUMN))
        initial = _initial_groups(spec, table.filter(is_init))
        table = table.filter(pc.invert(is_init)).drop_columns([INIT_COLUMN])
    if table is not None and spec.event_time_column and times.late_watermark_ms >= 0:
        micros = pc.cast(table.column(spec.event_time_column), pa.int64())
        late = pc.fill_null(pc.less_equal(micros, times.late_watermark_ms * 1000), False)
        n_late = pc.sum(late).as_py() or 0
        if spec.late_rows == "drop":
            late_dropped = n_late
            table = table.filter(pc.invert(late))
        else:
            late_passed = n_late
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
    for batch in _output_batches(spec, outputs, out_schema):
        out_rows += batch.num_rows
        yield batch
    stats = replace(
        stats, late_rows_dropped=late_dropped, late_rows_passed=late_passed, output_rows=out_rows
    )
    yield result_batch(result.to_bytes(), stats.to_bytes(), out_schema)


# ----------------------------------------------------------------- input
def _key_positions(keys: list[Any]) -> dict[Any, list[int]]:
    """Row positions per key, keys in order of first appearance."""
    where: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        found = where.get(k)
        if found is None:
            where[k] = [i]
        else:
            found.append(i)
    return where


def _spark_rows(table: Any, conf: PandasConf) -> list[Any]:
    """The rows of ``table`` as Spark's ``transformWithStateInPandas`` reads them.

    Spark's own Arrow-to-pandas conversion (timestamps as naive
    ``datetime64[ns]`` in the session time zone, dates as ``datetime.date``,
    decimals as ``Decimal``, arrays as NumPy arrays, maps and structs as
    dicts, binary as ``bytes``), then one named tuple per row: Spark builds
    each key's DataFrame from these (:func:`_frame`), so pandas infers its
    dtypes again (``int32`` becomes ``int64``, ``float32`` ``float64``).
    """
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.conversion import ArrowBatchTransformer

    zoned = [
        pa.field(f.name, pa.timestamp(f.type.unit, conf.timezone), f.nullable)
        if pa.types.is_timestamp(f.type) and f.type.tz is not None
        else f
        for f in table.schema
    ]
    if zoned != list(table.schema):  # Spark's Arrow columns carry the session zone
        table = table.cast(pa.schema(zoned))
    series = ArrowBatchTransformer.to_pandas(
        table, timezone=conf.timezone, prefer_int_ext_dtype=conf.prefer_int_ext_dtype
    )
    return list(pd.concat(series, axis=1).itertuples(index=False))


def _to_pandas(table: Any, timezone: str) -> Any:
    """``table`` as one DataFrame built as Spark builds a key's (sorted mode slices it)."""
    import pandas as pd

    rows = _spark_rows(table, PandasConf(timezone=timezone))
    if not rows:
        return pd.DataFrame({name: [] for name in table.column_names})
    return pd.DataFrame(rows)


def _frames(rows: list[Any], positions: list[int]) -> Iterator[Any]:
    """A key's rows as Spark hands them over: DataFrames of at most ``_MAX_RECORDS`` rows."""
    import pandas as pd

    for start in range(0, len(positions), _MAX_RECORDS):
        yield pd.DataFrame([rows[i] for i in positions[start : start + _MAX_RECORDS]])


def _input_groups(spec: ProcessorTaskSpec, table: Any) -> tuple[Iterator[tuple[Any, Any]], int]:
    """``(key, rows)`` per key, rows as ``handleInputRows`` gets them (lazily built)."""
    if table is None or table.num_rows == 0:
        return iter(()), 0
    where = _key_positions(table.column(spec.key).to_pylist())
    n = table.num_rows
    if spec.use_pandas:
        spark_rows = _spark_rows(table, spec.pandas)

        def frames() -> Iterator[tuple[Any, Any]]:
            for k, positions in where.items():
                yield k, _frames(spark_rows, positions)

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
    where = _key_positions(table.column(spec.key).to_pylist())
    if spec.use_pandas:
        rows = _spark_rows(init, spec.pandas)
        return [(k, list(_frames(rows, p))) for k, p in where.items()]
    from pyspark.sql import Row

    make = Row(*init.column_names)
    cols = [init.column(c).to_pylist() for c in init.column_names]
    return [(k, [make(*(c[i] for c in cols)) for i in p]) for k, p in where.items()]


# ---------------------------------------------------------------- output
def _column(values: Any, field: Any, timezone: str) -> Any:
    """One output column as an Arrow array of the field's type (lenient casts, as Spark's)."""
    import pyarrow as pa

    if isinstance(values, list):
        try:
            return pa.array(values, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgument(f"output column {field.name!r}: {exc}") from None
    series = values
    naive = str(series.dtype).startswith("datetime64") and getattr(series.dt, "tz", None) is None
    if pa.types.is_timestamp(field.type) and naive:
        series = series.dt.tz_localize(timezone)
    try:
        return pa.array(series, type=field.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        try:
            return pa.array(series, from_pandas=True).cast(field.type, safe=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise InvalidArgument(f"output column {field.name!r}: {exc}") from None


def _frame_columns(pdf: Any, fields: list[Any]) -> list[Any]:
    """The output fields' columns of a DataFrame: by name, or by position if unnamed."""
    names = [f.name for f in fields]
    labels = list(pdf.columns)
    if all(n in labels for n in names):
        return [pdf[n] for n in names]
    if len(labels) == len(names) and not any(isinstance(c, str) for c in labels):
        return [pdf.iloc[:, i] for i in range(len(names))]
    raise InvalidArgument(
        f"an output DataFrame has columns {labels}, the output schema {names}: "
        "name them as the schema's fields (or leave them unnamed, by position)"
    )


def _row_values(row: Any, names: list[str]) -> list[Any]:
    if isinstance(row, dict):
        return [row.get(n) for n in names]
    if hasattr(row, "asDict") and hasattr(row, "__fields__"):
        d = row.asDict()
        return [d.get(n) for n in names]
    if isinstance(row, tuple | list):
        if len(row) != len(names):
            raise InvalidArgument(f"an output row has {len(row)} values, the schema {len(names)}")
        return list(row)
    raise InvalidArgument(f"an output row is a Row, tuple or dict, not {type(row).__name__}")


def _output_batches(spec: ProcessorTaskSpec, outputs: list[Any], out_schema: Any) -> Iterator[Any]:
    fields = user_arrow_fields(out_schema)
    if not outputs or not fields:
        return
    if spec.use_pandas:
        frames = []
        for o in outputs:
            if not (hasattr(o, "columns") and hasattr(o, "iloc")):
                raise InvalidArgument(
                    "a pandas processor outputs pandas DataFrames, not "
                    f"{type(o).__name__} (use_pandas=False for Rows)"
                )
            if len(o):
                frames.append(o)
        if not frames:
            return
        pdf = _concat_frames(frames)
        for start in range(0, len(pdf), _OUT_BATCH_ROWS):
            chunk = pdf.iloc[start : start + _OUT_BATCH_ROWS]
            cols = _frame_columns(chunk, fields)
            arrays = [_column(c, f, spec.timezone) for c, f in zip(cols, fields, strict=True)]
            yield output_batch(arrays, out_schema)
        return
    names = [f.name for f in fields]
    for start in range(0, len(outputs), _OUT_BATCH_ROWS):
        chunk = [_row_values(r, names) for r in outputs[start : start + _OUT_BATCH_ROWS]]
        columns = [list(c) for c in zip(*chunk, strict=True)]
        arrays = [_column(c, f, spec.timezone) for c, f in zip(columns, fields, strict=True)]
        yield output_batch(arrays, out_schema)


def _concat_frames(frames: list[Any]) -> Any:
    """The output DataFrames as one, as ``pd.concat`` would make it.

    A processor yields one small DataFrame per key, and ``pd.concat`` pays
    ~80 us of bookkeeping per frame. Frames with the same columns (the usual
    case) are stacked as object arrays and their dtypes inferred once (the
    same dtypes ``concat`` gives; a missing value stays a null for Arrow),
    about 3x cheaper; anything else goes through ``pd.concat``.
    """
    import numpy as np
    import pandas as pd

    if len(frames) == 1:
        return frames[0]
    columns = frames[0].columns
    if not (columns.is_unique and all(f.columns.equals(columns) for f in frames)):
        return pd.concat(frames, ignore_index=True)
    values = np.concatenate([f.to_numpy(dtype=object) for f in frames])
    out = pd.DataFrame(values, columns=columns).infer_objects()
    for j, dtype in enumerate(out.dtypes):
        # integers with a missing value: concat keeps them as objects (Arrow: int64
        # with a null), inference would make them floats (precision lost past 2**53)
        if dtype.kind == "f" and any(
            isinstance(v, int | np.integer) and not isinstance(v, bool) for v in values[:, j]
        ):
            out[columns[j]] = pd.Series(values[:, j], dtype=object)
    return out


def stats_of(extra: bytes | None) -> ProcessorStats:
    """A task's figures from its result row (empty ones if it sent none)."""
    return ProcessorStats() if extra is None else ProcessorStats.from_bytes(extra)
