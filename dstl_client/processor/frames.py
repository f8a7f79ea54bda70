"""A processor's frames: its Arrow input as pandas DataFrames or Rows, its output as Arrow.

``transformWithStateInPandas`` hands a key's rows over as pandas DataFrames
built as Spark builds them (:func:`spark_rows`, :func:`pandas_frames`) and
takes DataFrames back; ``transformWithState`` takes Rows, tuples or dicts.
:func:`output_batches` converts either back to Arrow batches of the output
schema, with Spark's lenient casts. Shared by the streaming task
(:mod:`.task`) and the sorted mode (:mod:`dstl_client.bounded.task`). Pure
functions: they run on a Spark task thread of a Python worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dstl_client.batch.columns import output_batch, user_arrow_fields
from dstl_client.core.errors import InvalidArgument

#: output rows per Arrow batch returned by a task
OUT_BATCH_ROWS = 10_000
#: rows per input DataFrame of a key (``spark.sql.execution.arrow.maxRecordsPerBatch``'s default)
MAX_RECORDS = 10_000


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


def key_positions(keys: list[Any]) -> dict[Any, list[int]]:
    """Row positions per key, keys in order of first appearance."""
    where: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        found = where.get(k)
        if found is None:
            where[k] = [i]
        else:
            found.append(i)
    return where


def spark_rows(table: Any, conf: PandasConf) -> list[Any]:
    """The rows of ``table`` as Spark's ``transformWithStateInPandas`` reads them.

    Spark's own Arrow-to-pandas conversion (timestamps as naive
    ``datetime64[ns]`` in the session time zone, dates as ``datetime.date``,
    decimals as ``Decimal``, arrays as NumPy arrays, maps and structs as
    dicts, binary as ``bytes``), then one named tuple per row: Spark builds
    each key's DataFrame from these (:func:`pandas_frames`), so pandas infers its
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


def to_pandas(table: Any, timezone: str) -> Any:
    """``table`` as one DataFrame built as Spark builds a key's (sorted mode slices it)."""
    import pandas as pd

    rows = spark_rows(table, PandasConf(timezone=timezone))
    if not rows:
        return pd.DataFrame({name: [] for name in table.column_names})
    return pd.DataFrame(rows)


def pandas_frames(rows: list[Any], positions: list[int]) -> Iterator[Any]:
    """A key's rows as Spark hands them over: DataFrames of at most ``MAX_RECORDS`` rows."""
    import pandas as pd

    for start in range(0, len(positions), MAX_RECORDS):
        yield pd.DataFrame([rows[i] for i in positions[start : start + MAX_RECORDS]])


# ---------------------------------------------------------------- output
def arrow_column(values: Any, field: Any, timezone: str) -> Any:
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


def frame_columns(pdf: Any, fields: list[Any]) -> list[Any]:
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


def row_values(row: Any, names: list[str]) -> list[Any]:
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


def output_batches(
    outputs: list[Any], out_schema: Any, *, use_pandas: bool, timezone: str
) -> Iterator[Any]:
    """What a processor returned (pandas DataFrames, or Rows/tuples/dicts) as Arrow batches
    of ``out_schema`` (:func:`~dstl_client.batch.columns.output_batch`); naive timestamps
    are in ``timezone``."""
    fields = user_arrow_fields(out_schema)
    if not outputs or not fields:
        return
    if use_pandas:
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
        pdf = concat_frames(frames)
        for start in range(0, len(pdf), OUT_BATCH_ROWS):
            chunk = pdf.iloc[start : start + OUT_BATCH_ROWS]
            cols = frame_columns(chunk, fields)
            arrays = [arrow_column(c, f, timezone) for c, f in zip(cols, fields, strict=True)]
            yield output_batch(arrays, out_schema)
        return
    names = [f.name for f in fields]
    for start in range(0, len(outputs), OUT_BATCH_ROWS):
        chunk = [row_values(r, names) for r in outputs[start : start + OUT_BATCH_ROWS]]
        columns = [list(c) for c in zip(*chunk, strict=True)]
        arrays = [arrow_column(c, f, timezone) for c, f in zip(columns, fields, strict=True)]
        yield output_batch(arrays, out_schema)


def concat_frames(frames: list[Any]) -> Any:
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
