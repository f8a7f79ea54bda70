"""What may follow ``transform_with_state`` in a query: stateless steps, more stateful stages.

Spark's ``transformWithState`` returns a streaming DataFrame. dstl runs the
operator in ``foreachBatch``, so its output is a :class:`ProcessorOutput`:
what Spark's chaining offers, on each micro-batch's output rows::

    sessions = transform_with_state(
        events.groupBy("user"), processor=Sessions(),
        output_schema="user string, ended timestamp, clicks long",
        time_mode="EventTime", event_time_column="ts", watermark_delay="10 seconds",
        output_event_time_column="ended",            # Spark's eventTimeColumnName
        parallelism=4, dstl_address=...)
    per_window = transform_with_state(
        sessions.withColumn("window", bucket_of("ended")).groupBy("window"),
        processor=CountPerWindow(), output_schema="window long, sessions long",
        time_mode="EventTime")                        # event time: "ended", same watermark
    per_window.where("sessions > 1").writeStream.format("parquet")...start(path)

* **Stateless steps**: :meth:`ProcessorOutput.then` (``fn(DataFrame) ->
  DataFrame``) and its shorthands ``select``, ``selectExpr``, ``where``/
  ``filter``, ``withColumn``, ``withColumns``, ``withColumnRenamed``,
  ``drop``: applied on the driver to each batch's output before the next
  stage or the sink. A step is checked once, on an empty DataFrame of the
  output's schema: it must be per row (no aggregation, deduplication,
  sort, limit, window function, watermark, streaming input), since here it
  only ever sees one batch (Spark would keep state across batches).
* **A stateful stage**: ``transform_with_state(output.groupBy(key), ...)``
  (or ``output`` with ``key=``), one more keyed operator of the same query
  (:func:`~dstl_client.batch.cycle.run_chain`: its own state, records and
  parallelism; exactly-once across the chain). Its event time is the column
  the stage before named in ``output_event_time_column`` (Spark's
  ``eventTimeColumnName``); the watermark is the query's (Spark's rule: one
  watermark, from the input's ``withWatermark``), so the next stage's timers
  fire and its late rows are judged at the same watermark. As in Spark, a
  stage that names an output event-time column may not emit a row at or
  before the watermark for late rows (:func:`check_event_times`).
* ``writeStream``, as before.

Anything else a DataFrame offers raises :class:`~dstl_client.core.errors.ConfigError`
naming these shapes.

Objects are immutable (each step returns a new output); built on the
user's thread, applied on the ``foreachBatch`` thread.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.processor.progress import ProcessorQuery
from dstl_client.processor.sinks import WriteSpec
from dstl_client.processor.writer import ProcessorStream

#: the shapes that may follow the operator (named by every refusal)
SUPPORTED = (
    "after transform_with_state come: stateless steps on each batch's output (.then(fn), "
    ".select, .selectExpr, .where/.filter, .withColumn, .withColumns, .withColumnRenamed, "
    ".drop), a stateful stage (transform_with_state(output.groupBy(key), ...), its event "
    "time from output_event_time_column, Spark's eventTimeColumnName) and .writeStream"
)

#: logical plan nodes a stateless step may not contain (Spark keeps state for them
#: across batches, or they need the whole stream)
STATEFUL_NODES = frozenset(
    {
        "Aggregate",
        "Deduplicate",
        "DeduplicateWithinWatermark",
        "Distinct",
        "EventTimeWatermark",
        "Except",
        "FlatMapCoGroupsInArrow",
        "FlatMapCoGroupsInPandas",
        "FlatMapGroupsInArrow",
        "FlatMapGroupsInPandas",
        "FlatMapGroupsInPandasWithState",
        "GlobalLimit",
        "Intersect",
        "LocalLimit",
        "Offset",
        "Sort",
        "Tail",
        "TransformWithStateInPySpark",
        "Window",
        "WindowGroupLimit",
    }
)

Step = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Segment:
    """One stateful stage of a pipeline and the stateless steps on its output. Frozen."""

    #: the stage as :mod:`.transform` plans it (opaque here)
    stage: Any
    steps: tuple[Step, ...] = ()


#: ``start(output, write, query_options)``: the running query of ``output``
PipelineStarter = Callable[["ProcessorOutput", WriteSpec, dict[str, Any]], ProcessorQuery]


class ProcessorOutput(ProcessorStream):
    """The output of ``transform_with_state`` (see the module): write it, or go on with it.

    Invariant: ``schema`` is the rows' schema after every step; ``event_time_column``
    is the output's event-time column (``None``: the stages after have no event
    time). Immutable. Thread: the caller's.
    """

    def __init__(
        self,
        *,
        segments: tuple[Segment, ...],
        schema: Any,
        output_mode: str,
        event_time_column: str | None,
        session: Any,
        starter: PipelineStarter,
    ) -> None:
        super().__init__(lambda write, query: starter(self, write, query), schema, output_mode)
        self.segments = segments
        self.event_time_column = event_time_column
        self.session = session
        self._pipeline_starter = starter

    @property
    def isStreaming(self) -> bool:
        return True

    @property
    def output_mode(self) -> str:
        return self._output_mode

    # ------------------------------------------------------ stateless steps
    def then(self, fn: Step) -> ProcessorOutput:
        """``fn(batch_output) -> DataFrame`` on each batch's output (stateless: see the module)."""
        if not callable(fn):
            raise ConfigError(f"then() takes a function of a DataFrame, not {type(fn).__name__}")
        schema = step_schema(self.session, self.schema, fn)
        last = self.segments[-1]
        segments = (*self.segments[:-1], Segment(last.stage, (*last.steps, fn)))
        column = self.event_time_column
        if column is not None and not _is_timestamp(schema, column):
            column = None  # dropped or changed: the stages after have no event time
        return ProcessorOutput(
            segments=segments,
            schema=schema,
            output_mode=self._output_mode,
            event_time_column=column,
            session=self.session,
            starter=self._pipeline_starter,
        )

    def select(self, *cols: Any) -> ProcessorOutput:
        return self.then(lambda df: df.select(*cols))

    def selectExpr(self, *exprs: str) -> ProcessorOutput:
        return self.then(lambda df: df.selectExpr(*exprs))

    def where(self, condition: Any) -> ProcessorOutput:
        return self.then(lambda df: df.where(condition))

    filter = where

    def withColumn(self, colName: str, col: Any) -> ProcessorOutput:
        return self.then(lambda df: df.withColumn(colName, col))

    def withColumns(self, colsMap: dict[str, Any]) -> ProcessorOutput:
        return self.then(lambda df: df.withColumns(colsMap))

    def withColumnRenamed(self, existing: str, new: str) -> ProcessorOutput:
        return self.then(lambda df: df.withColumnRenamed(existing, new))

    def drop(self, *cols: Any) -> ProcessorOutput:
        return self.then(lambda df: df.drop(*cols))

    # -------------------------------------------------------- a next stage
    def groupBy(self, *cols: Any) -> GroupedOutput:
        """The output grouped by one column: the input of a next ``transform_with_state``."""
        if len(cols) != 1 or not isinstance(cols[0], str):
            raise ConfigError(
                f"groupBy on the output of transform_with_state takes one column name, "
                f"not {cols!r}; {SUPPORTED}"
            )
        if cols[0] not in self.columns:
            raise ConfigError(f"groupBy({cols[0]!r}): not a column of {self.columns}")
        return GroupedOutput(self, cols[0])

    groupby = groupBy

    def __getattr__(self, name: str) -> Any:
        _refuse(name, "DataFrame")
        raise AttributeError(name)

    def __repr__(self) -> str:
        return (
            f"ProcessorOutput[{len(self.segments)} stage(s)]"
            f"({', '.join(f'{f.name}: {f.dataType.simpleString()}' for f in self.schema.fields)})"
        )


class GroupedOutput:
    """``ProcessorOutput.groupBy(key)``: what a next ``transform_with_state`` takes. Frozen.

    Its aggregations (``agg``, ``count``...) are not offered: a stateful
    aggregation is a stage (a processor) here.
    """

    def __init__(self, output: ProcessorOutput, key: str) -> None:
        self.output = output
        self.key = key

    def __getattr__(self, name: str) -> Any:
        _refuse(name, "GroupedData")
        raise AttributeError(name)


def _refuse(name: str, kind: str) -> None:
    """A :class:`ConfigError` for a public attribute of Spark's ``kind`` (else nothing)."""
    if name.startswith("_"):
        return
    from pyspark.sql import DataFrame, GroupedData

    cls = DataFrame if kind == "DataFrame" else GroupedData
    if hasattr(cls, name):
        raise ConfigError(
            f"{name}() is not supported on the output of transform_with_state: {SUPPORTED}"
        )


# --------------------------------------------------------------- checks
def plan_nodes(df: Any) -> list[str]:
    """The node names of ``df``'s analyzed logical plan (depth first)."""
    names: list[str] = []
    todo = [df._jdf.queryExecution().analyzed()]
    while todo:
        node = todo.pop()
        names.append(str(node.nodeName()))
        children = node.children()
        todo.extend(children.apply(i) for i in range(children.size()))
    return names


def step_schema(session: Any, schema: Any, fn: Step) -> Any:
    """The schema of ``fn``'s result on rows of ``schema``; :class:`ConfigError` unless stateless.

    ``fn`` runs once on an empty DataFrame (analysis only, no Spark job).
    """
    probe = session.createDataFrame([], schema)
    try:
        out = fn(probe)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"then(): the step fails on the output's schema: {exc}") from None
    if not (hasattr(out, "schema") and hasattr(out, "isStreaming") and hasattr(out, "_jdf")):
        raise ConfigError(f"then(): the step returns a DataFrame, not {type(out).__name__}")
    if out.isStreaming:
        raise ConfigError("then(): the step reads a streaming DataFrame; it gets each batch's rows")
    stateful = sorted(set(plan_nodes(out)) & STATEFUL_NODES)
    if stateful:
        raise ConfigError(
            f"then(): the step is not stateless ({', '.join(stateful)}): it would see one "
            f"micro-batch at a time where Spark keeps state across batches; {SUPPORTED}"
        )
    return out.schema


def _is_timestamp(schema: Any, column: str) -> bool:
    from pyspark.sql import types as T

    return column in schema.fieldNames() and isinstance(schema[column].dataType, T.TimestampType)


def check_output_event_time_column(schema: Any, column: str) -> None:
    """``output_event_time_column`` names a timestamp column of the output (else ConfigError)."""
    if column not in schema.fieldNames():
        raise ConfigError(
            f"output_event_time_column {column!r} is not in the output schema {schema.fieldNames()}"
        )
    if not _is_timestamp(schema, column):
        raise ConfigError(f"output_event_time_column {column!r} must be a timestamp column")


def check_event_times(rows: Any, column: str, late_watermark_ms: int, batch_id: int) -> None:
    """Spark's rule for an operator's output event time: no row at or before the watermark
    for late rows (``EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED``); one small job.

    Raises :class:`InvalidArgument` naming the first such row's time. Driver's batch thread.
    """
    if late_watermark_ms < 0:
        return
    from pyspark.sql import functions as F

    bound = F.timestamp_millis(F.lit(late_watermark_ms))
    found = rows.where(F.col(column) <= bound).select(column).limit(1).collect()
    if found:
        watermark = datetime.datetime.fromtimestamp(late_watermark_ms / 1000, datetime.UTC)
        raise InvalidArgument(
            f"EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED: batch {batch_id}: the processor "
            f"emitted a row with {column}={found[0][0]} at or before the watermark "
            f"{watermark.isoformat()}; a stage that names output_event_time_column emits rows "
            "after the watermark (as Spark's eventTimeColumnName requires)"
        )


def apply_steps(rows: Any, steps: tuple[Step, ...]) -> Any:
    """``rows`` through each stateless step, in order."""
    for step in steps:
        rows = step(rows)
    return rows
