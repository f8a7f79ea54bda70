"""``transform_with_state``'s arguments, checked and shaped for the query (the driver's side).

The time mode, the input's event-time column and watermark, the initial
state as rows to route with the input (:data:`~.task.INIT_COLUMN`), and the
stage before a stage of a pipeline. Each raises
:class:`~dstl_client.core.errors.ConfigError` naming what is wrong. Used by
the streaming (:mod:`.transform`) and the sorted mode
(:mod:`dstl_client.bounded`). The caller's thread.
"""

from __future__ import annotations

from typing import Any

from dstl_client.batch.inputs import grouping
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.processor.api import time_mode_of
from dstl_client.processor.pipeline import GroupedOutput, ProcessorOutput
from dstl_client.processor.task import INIT_COLUMN
from dstl_client.processor.times import parse_duration_ms


def upstream_of(data: Any, key: str | None) -> tuple[ProcessorOutput, str] | None:
    """The output of an earlier stage ``data`` is (or its ``groupBy``), and the key; ``None``
    if ``data`` is not one."""
    if isinstance(data, GroupedOutput):
        if key and key != data.key:
            raise ConfigError(f"key={key!r} but the output is grouped by {data.key!r}")
        return data.output, data.key
    if isinstance(data, ProcessorOutput):
        if not key:
            raise ConfigError("give the grouping column: key=..., or pass output.groupBy(column)")
        return data, key
    return None


def inherited_event_time(
    upstream: ProcessorOutput, mode: str, column: str | None, delay: str | None
) -> str | None:
    """A later stage's event-time column: the one the stage before carries (Spark's rule)."""
    inherited = upstream.event_time_column
    if delay is not None:
        raise ConfigError(
            "watermark_delay: a stage after transform_with_state has the query's watermark "
            "(from the input's withWatermark), as in Spark"
        )
    if column is not None and column != inherited:
        raise ConfigError(
            f"event_time_column={column!r}: a stage after transform_with_state has the event "
            f"time the stage before names in output_event_time_column ({inherited!r})"
        )
    if mode == "EventTime" and inherited is None:
        raise ConfigError(
            "time mode EventTime after transform_with_state needs an event time: give the stage "
            "before output_event_time_column (Spark's eventTimeColumnName), a timestamp column "
            "its steps keep"
        )
    return inherited


def time_mode_arg(value: str) -> str:
    try:
        return time_mode_of(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def with_event_time(df: Any, mode: str, column: str | None, delay: str | None) -> Any:
    """``df`` with its watermark; checks the event-time arguments."""
    from pyspark.sql import types as T

    if column is None:
        if mode == "EventTime":
            raise ConfigError("time mode EventTime needs event_time_column (and watermark_delay)")
        if delay is not None:
            raise ConfigError("watermark_delay needs event_time_column")
        return df
    if column not in df.columns:
        raise ConfigError(f"event_time_column {column!r} is not in {df.columns}")
    if not isinstance(df.schema[column].dataType, T.TimestampType | T.TimestampNTZType):
        raise ConfigError(f"event_time_column {column!r} must be a timestamp column")
    if delay is not None:
        try:
            parse_duration_ms(delay)
        except InvalidArgument as exc:
            raise ConfigError(exc.message) from None
        return df.withWatermark(column, delay)
    plan = df._jdf.queryExecution().logical().toString()
    if "EventTimeWatermark" not in plan:
        raise ConfigError(
            f"event_time_column {column!r}: give watermark_delay, or call withWatermark first"
        )
    return df


def initial_rows(initial_state: Any, key: str, df: Any) -> tuple[Any, tuple[str, ...] | None, Any]:
    """The initial state as rows to route (key, ``INIT_COLUMN`` struct), its columns, the struct."""
    if initial_state is None:
        return None, None, None
    from pyspark.sql import GroupedData
    from pyspark.sql import functions as F

    init_df, init_key = (
        grouping(initial_state, key)
        if isinstance(initial_state, GroupedData)
        else (initial_state, key)
    )
    if init_df.isStreaming:
        raise ConfigError("initial_state is a batch DataFrame")
    if init_key not in init_df.columns:
        raise ConfigError(f"the initial state has no key column {init_key!r}")
    columns = tuple(init_df.columns)
    rows = init_df.select(
        F.col(init_key).cast(df.schema[key].dataType).alias(key),
        F.struct(*[F.col(c) for c in columns]).alias(INIT_COLUMN),
    )
    return rows, columns, rows.schema[INIT_COLUMN].dataType
