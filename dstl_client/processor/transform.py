"""``transform_with_state``: a ``StatefulProcessor`` over a streaming DataFrame, state on the DSTL.

::

    from dstl_client.processor import transform_with_state

    q = (transform_with_state(events.groupBy("user"), processor=CountPerUser(),
                              output_schema="user string, count long",
                              parallelism=4, dstl_address="unix:///var/run/dstl/dstl.sock")
         .writeStream.format("parquet")
         .option("checkpointLocation", "/ckpt/clicks")
         .start("/out/clicks"))

Spark's ``transformWithStateInPandas`` (``use_pandas=True``) or
``transformWithState`` (``use_pandas=False``) on dstl's keyed batch cycle
(:func:`~dstl_client.spark.keyed.run_keyed_query`): rows routed by key
group, one :func:`~.task.processor_task` per partition, every state change
(timers and TTL index included) logged to the DSTL and checkpointed.

The driver side of a batch (:class:`ProcessorDriver`, on the ``foreachBatch``
thread): read the batch's times from Spark's offsets log (:mod:`.times`),
add the initial state to the first batch, and after the checkpoint record
sum the tasks' figures into the query's progress (:mod:`.progress`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any

from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.messages import BatchPlan
from dstl_client.coordinator.state_schemas import OperatorSchemas, declared_of
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.extras import require_spark
from dstl_client.keywords import check_keywords
from dstl_client.processor.api import time_mode_of
from dstl_client.processor.codec import RowCodec
from dstl_client.processor.conf import merged_options
from dstl_client.processor.layout import check_state_name
from dstl_client.processor.pipeline import (
    GroupedOutput,
    ProcessorOutput,
    Segment,
    apply_steps,
    check_event_times,
    check_output_event_time_column,
)
from dstl_client.processor.progress import ProcessorQuery
from dstl_client.processor.runner import KEY_DECODERS, ProcessorTask
from dstl_client.processor.sinks import WriteSpec, make_sink
from dstl_client.processor.stats import BatchFigures
from dstl_client.processor.task import INIT_COLUMN, ProcessorTaskSpec, processor_task, stats_of
from dstl_client.processor.times import BatchTimes, batch_times, parse_duration_ms
from dstl_client.processor.writer import OUTPUT_MODES
from dstl_client.spark.chain import ChainLink, ChainQuery, run_chain, stage_options
from dstl_client.spark.keyed import (
    BatchHooks,
    KeyedSchemas,
    TaskFunction,
    keyed_schemas,
    run_keyed_query,
)
from dstl_client.spark.options import KeyedOptions, default_job_id

log = logging.getLogger(__name__)

LATE_ROWS = ("drop", "pass")


def transform_with_state(
    data: Any,
    *,
    processor: Any,
    output_schema: Any,
    key: str | None = None,
    output_mode: str = "Update",
    time_mode: str = "None",
    event_time_column: str | None = None,
    watermark_delay: str | None = None,
    late_rows: str = "drop",
    use_pandas: bool = True,
    initial_state: Any = None,
    count_state_rows: bool = True,
    config: KeyedOptions | None = None,
    execution_mode: str = "auto",
    output_event_time_column: str | None = None,
    **options: Any,
) -> Any:
    """Run ``processor`` per key and micro-batch; write its output with ``.writeStream``.

    ``data`` is a streaming DataFrame with the grouping column ``key``, or
    ``df.groupBy("key")`` (one string or integer column; rows with a null key
    are dropped). ``processor`` is a :class:`~.api.StatefulProcessor` (Spark's
    own works too); its input per key is an iterator of pandas DataFrames
    (``use_pandas=True``) or of ``Row``\\ s, and so is its output, rows of
    ``output_schema`` (``StructType`` or DDL). ``output_mode``: ``"Append"``
    or ``"Update"`` (it only names what the rows mean, as in Spark).

    Time: ``time_mode`` is ``"None"``, ``"ProcessingTime"`` (timers and TTL
    on the batch timestamp) or ``"EventTime"`` (timers on the watermark).
    ``event_time_column`` is the input's event-time column (a timestamp); with
    ``watermark_delay`` (``"10 seconds"``) it gets ``withWatermark`` here,
    without it the input must have one already. Rows at or before the
    previous batch's watermark are late (:mod:`.times`, as in Spark): dropped (``late_rows="drop"``, as in
    Spark) or passed on (``"pass"``); both are counted.

    ``initial_state`` (a batch DataFrame or its ``groupBy`` on the same key):
    ``handleInitialState`` gets its rows in the first batch.

    How the query runs is a :class:`~dstl_client.spark.options.KeyedOptions`:
    ``config`` and the keyword ``options`` (``parallelism``,
    ``checkpoint_dir``, ``dstl_address``...), with ``spark.dstl.*`` keys of
    the session's configuration filling what is not given
    (:mod:`.conf`); ``checkpointLocation``, ``trigger`` and ``queryName`` may
    come from the writer instead. ``count_state_rows``: count the state rows
    after each batch (one scan of each task's store) for the progress figures.

    The processor's ``init`` runs once here (on a copy) to check its state
    declarations, as Spark's driver does.

    ``output_event_time_column`` (Spark's ``eventTimeColumnName``): the
    output's event-time column (a timestamp), the event time of the stages
    after this one, with the query's watermark; no output row may lie at or
    before the watermark for late rows (as in Spark).

    A bounded DataFrame (or ``execution_mode="sorted"``) runs in sorted
    single-key mode (:func:`dstl_client.bounded.process_bounded`) and the
    result is a DataFrame; otherwise a :class:`~.pipeline.ProcessorOutput`:
    written with ``.writeStream``, or followed by stateless steps
    (``.then(fn)``, ``.select``, ``.where``...) or by another stateful
    stage: ``data`` may be such an output (or its ``groupBy(key)``); that
    stage's options are ``operator_id`` (default ``<first stage's>-<n>``,
    its position), ``parallelism`` and ``max_parallelism``, the rest is the
    query's, given to the first stage or the writer (:mod:`.pipeline`).
    """
    require_spark("transform_with_state")
    from pyspark import cloudpickle

    from dstl_client.bounded import process_bounded, sorted_mode  # here: an import cycle

    check_keywords("transform_with_state", options, KeyedOptions)
    mode = _time_mode(time_mode)
    found = _upstream(data, key)
    upstream = None if found is None else found[0]
    if found is not None:
        upstream, key = found
        if execution_mode not in ("auto", "streaming"):
            raise ConfigError(
                f"execution_mode={execution_mode!r}: a stage after transform_with_state "
                "runs in the same streaming query"
            )
        if config is not None or set(options) - STAGE_OPTIONS:
            raise ConfigError(
                f"a stage after transform_with_state takes {sorted(STAGE_OPTIONS)}; "
                f"the query's other options go to the first stage or the writer, not "
                f"{sorted(set(options) - STAGE_OPTIONS) or ['config']}"
            )
        session = upstream.session
        df = session.createDataFrame([], upstream.schema)  # the stage's input, for its checks
        event_time_column = _inherited_event_time(
            upstream, mode, event_time_column, watermark_delay
        )
    else:
        df, key = _grouping(data, key)
        if sorted_mode(df, execution_mode):
            if output_event_time_column is not None:
                raise ConfigError(
                    "output_event_time_column: a bounded input runs in sorted mode "
                    "and its result is a DataFrame"
                )
            return process_bounded(
                df,
                key=key,
                processor=processor,
                output_schema=output_schema,
                time_mode=time_mode,
                event_time_column=event_time_column,
                use_pandas=use_pandas,
                initial_state=initial_state,
                config=config,
                **options,
            )
        if not df.isStreaming:
            raise ConfigError("transform_with_state needs a streaming DataFrame")
        session = df.sparkSession
        df = _event_time(df, mode, event_time_column, watermark_delay)
    kind = _key_kind(df, key)
    if output_mode.lower() not in OUTPUT_MODES:
        raise ConfigError(f"output mode {output_mode!r}: a processor supports Append or Update")
    if late_rows not in LATE_ROWS:
        raise ConfigError(f"late_rows={late_rows!r}: use one of {LATE_ROWS}")
    declared = _check_processor(processor, mode)
    schemas = keyed_schemas(output_schema)
    if output_event_time_column is not None:
        check_output_event_time_column(schemas.user, output_event_time_column)
        if event_time_column is None:
            raise ConfigError(
                "output_event_time_column carries the input's watermark to the stages after; "
                "the input has none: give event_time_column (and watermark_delay)"
            )
    initial_df, initial_columns, init_type = _initial(initial_state, key, df)
    spec = ProcessorTaskSpec(
        processor=cloudpickle.dumps(processor),  # type: ignore[no-untyped-call]
        key=key,
        columns=tuple(df.columns),
        how=ProcessorTask(
            time_mode=mode, key_of=KEY_DECODERS[kind], count_state_rows=count_state_rows
        ),
        use_pandas=use_pandas,
        event_time_column=event_time_column,
        late_rows=late_rows,
        timezone=session.conf.get("spark.sql.session.timeZone") or "UTC",
        initial_columns=initial_columns,
    )
    stage = StagePlan(
        spec=spec,
        schemas=schemas,
        options=dict(options),
        config=config,
        initial_df=initial_df,
        init_type=init_type,
        output_event_time_column=output_event_time_column,
        source=df if upstream is None else None,
        state_schemas=declared.schemas(key, kind),
        deleted_states=tuple(declared.deleted),
    )
    segments = (Segment(stage),) if upstream is None else (*upstream.segments, Segment(stage))
    return ProcessorOutput(
        segments=segments,
        schema=schemas.user,
        output_mode=output_mode,
        event_time_column=output_event_time_column,
        session=session,
        starter=start_output,
    )


#: the options a stage after the first takes (the rest are the query's)
STAGE_OPTIONS = frozenset({"operator_id", "parallelism", "max_parallelism"})


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One processor stage as ``transform_with_state`` planned it, before the query starts.

    Frozen: built on the user's thread, read when the query starts.
    """

    spec: ProcessorTaskSpec
    schemas: KeyedSchemas
    #: the keyword options given to this stage's ``transform_with_state``
    options: dict[str, Any]
    config: KeyedOptions | None
    initial_df: Any
    init_type: Any
    output_event_time_column: str | None
    #: the query's streaming input (the first stage only)
    source: Any = None
    #: the states ``init`` declares, recorded with the checkpoints (checked at start)
    state_schemas: OperatorSchemas | None = None
    #: the states ``init`` deletes (``deleteIfExists``)
    deleted_states: tuple[str, ...] = ()


def start_output(output: ProcessorOutput, write: WriteSpec, query_options: dict[str, Any]) -> Any:
    """Start the query of ``output``: one stage on the keyed batch cycle, more as a chain.

    The first stage's options and the writer's make the query's options; a
    later stage gets them with its own operator id and parallelism.
    """
    first: StagePlan = output.segments[0].stage
    session = output.session
    options = first.options
    clash = sorted(k for k in query_options if k in options and options[k] != query_options[k])
    if clash:
        raise ConfigError(f"{clash} given to both transform_with_state and the writer")
    try:
        opts = merged_options(session, first.config, {**options, **query_options})
    except TypeError as exc:  # a required option is missing
        raise ConfigError(
            f"{exc}: give them to transform_with_state, to the writer "
            "(checkpointLocation) or as spark.dstl.* configuration keys"
        ) from None
    sink = make_sink(
        write,
        app_id=opts.job_id or default_job_id(opts.checkpoint_dir),
        session=session,
        schema=output.schema,
    )
    drivers = [
        ProcessorDriver(
            s.stage.spec,
            s.stage.schemas,
            opts,
            s.stage.initial_df,
            s.stage.init_type,
            state_schemas=s.stage.state_schemas,
            deleted_states=s.stage.deleted_states,
        )
        for s in output.segments
    ]
    afters = [
        functools.partial(d.after, s.stage.output_event_time_column, s.steps)
        for d, s in zip(drivers, output.segments, strict=True)
    ]
    if len(drivers) == 1:
        after = afters[0]

        def through(rows: Any, batch_id: int) -> None:
            sink(after(rows, batch_id), batch_id)

        plain = first.output_event_time_column is None and not output.segments[0].steps
        return drivers[0].start(first.source, sink if plain else through)
    links = []
    for i, (segment, driver, stage_after) in enumerate(
        zip(output.segments, drivers, afters, strict=True)
    ):
        stage: StagePlan = segment.stage
        stage_opts = stage_options(
            opts,
            stage.options.get("operator_id")
            or (opts.operator_id if i == 0 else f"{opts.operator_id}-{i + 1}"),
            stage.options.get("parallelism") if i else None,
        )
        if i and "max_parallelism" in stage.options:
            stage_opts = dataclasses.replace(
                stage_opts, max_parallelism=stage.options["max_parallelism"]
            )
        links.append(
            ChainLink(
                opts=stage_opts,
                key=stage.spec.key,
                schemas=stage.schemas,
                hooks=driver.hooks(),
                after=stage_after,
            )
        )

    def handle(coordinators: list[CheckpointCoordinator], port: int | None) -> ChainQuery:
        query = ProcessorChainQuery(coordinators, port)
        drivers[0].query = query  # the first stage's figures are the query's progress
        query.listen(session)
        return query

    try:
        chain = run_chain(first.source, links, sink=sink, opts=opts, handle_factory=handle)
    except BaseException:
        if drivers[0].query is not None:
            drivers[0].query.unlisten()
        raise
    assert isinstance(chain, ProcessorChainQuery)
    return chain


class ProcessorChainQuery(ChainQuery, ProcessorQuery):
    """A running chain of processor stages: one Spark query, a coordinator per stage.

    Its progress carries the first stage's figures (``"dstl"``); threads as
    :class:`~dstl_client.spark.chain.ChainQuery`.
    """


class ProcessorDriver:
    """The driver side of one processor query's batches (see the module documentation).

    Invariant: a batch's times are read from Spark's offsets log, never from
    the clock, so a re-run batch has the times of its first run. Thread: the
    ``foreachBatch`` thread (one batch at a time); :meth:`start` the user's.
    """

    def __init__(
        self,
        spec: ProcessorTaskSpec,
        schemas: KeyedSchemas,
        opts: KeyedOptions,
        initial_df: Any,
        init_type: Any,
        *,
        state_schemas: OperatorSchemas | None = None,
        deleted_states: tuple[str, ...] = (),
    ) -> None:
        self.spec = spec
        self.state_schemas = state_schemas
        self.deleted_states = deleted_states
        self.schemas = schemas
        self.opts = opts
        self.initial_df = initial_df
        self.init_type = init_type
        self.query: ProcessorQuery | None = None
        self._times: dict[int, BatchTimes] = {}

    def start(self, df: Any, sink: Any) -> ProcessorQuery:
        session = df.sparkSession

        def handle(coordinator: CheckpointCoordinator, port: int | None) -> ProcessorQuery:
            self.query = ProcessorQuery(coordinator, port)
            self.query.listen(session)
            return self.query

        hooks = self.hooks()
        try:
            query = run_keyed_query(
                df,
                key=self.spec.key,
                schemas=self.schemas,
                hooks=hooks,
                sink=sink,
                opts=self.opts,
                handle_factory=handle,
            )
        except BaseException:
            if self.query is not None:  # the query did not start: its coordinator is closed
                self.query.unlisten()
            raise
        assert isinstance(query, ProcessorQuery)
        return query

    # ----------------------------------------------------------- the times
    def times_of(self, session: Any, batch_id: int) -> BatchTimes:
        """The batch's times from Spark's offsets log (nothing to read in time mode None)."""
        event_time = self.spec.event_time_column is not None
        if self.spec.how.time_mode == "None" and not event_time:
            return BatchTimes()
        return batch_times(self.opts.spark_checkpoint_dir, batch_id, session, event_time=event_time)

    # --------------------------------------------------------------- hooks
    def hooks(self) -> BatchHooks:
        return BatchHooks(
            make_task=self.make_task,
            prepare=self.prepare,
            recorded=self.recorded,
            state_schemas=self.state_schemas,
            deleted_states=self.deleted_states,
        )

    def after(
        self, event_time_column: str | None, steps: tuple[Any, ...], rows: Any, batch_id: int
    ) -> Any:
        """The stage's output rows as the next stage (or the sink) reads them: the output
        event times checked against the batch's watermark, then the stateless ``steps``."""
        if event_time_column is not None:
            times = self._times.get(batch_id, BatchTimes())
            check_event_times(rows, event_time_column, times.late_watermark_ms, batch_id)
        return apply_steps(rows, steps)

    def make_task(self, plan: BatchPlan, batch_df: Any, batch_id: int) -> TaskFunction:
        times = self.times_of(batch_df.sparkSession, batch_id)
        self._times = {batch_id: times}
        return functools.partial(processor_task, self.spec, plan, times, self.schemas.arrow)

    def prepare(self, batch_df: Any, batch_id: int, plan: BatchPlan) -> Any:
        """The batch's rows, with the initial state's rows in the first batch."""
        if self.initial_df is None:
            return batch_df
        from pyspark.sql import functions as F

        rows = batch_df.withColumn(INIT_COLUMN, F.lit(None).cast(self.init_type))
        if plan.committed is None:
            rows = rows.unionByName(self.initial_df, allowMissingColumns=True)
        return rows

    def recorded(self, batch_id: int, extras: list[bytes | None]) -> None:
        times = self._times.get(batch_id, BatchTimes())
        query = self.query
        if query is None:
            return
        history = query.coordinator.history
        checkpoint = history[-1] if history and history[-1].batch_id == batch_id else None
        query.record(
            BatchFigures.of(
                batch_id,
                times.processing_ms,
                times.watermark_ms,
                [stats_of(e) for e in extras],
                checkpoint,
            )
        )


# ------------------------------------------------------------- arguments
def _upstream(data: Any, key: str | None) -> tuple[ProcessorOutput, str] | None:
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


def _inherited_event_time(
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


def _grouping(data: Any, key: str | None) -> tuple[Any, str]:
    """The DataFrame and key column of ``data`` (a DataFrame, or its ``groupBy(key)``)."""
    from pyspark.sql import GroupedData

    if not isinstance(data, GroupedData):
        if not key:
            raise ConfigError("give the grouping column: key=..., or pass df.groupBy(column)")
        return data, key
    try:
        exprs = data._jgd.groupingExprs()
        names = [exprs.apply(i).name() for i in range(exprs.size())]
    except Exception as exc:
        raise ConfigError(
            f"cannot read the grouping columns ({exc}): pass the DataFrame and key="
        ) from None
    if len(names) != 1:
        raise ConfigError(f"group by one column, not {names}")
    if key and key != names[0]:
        raise ConfigError(f"key={key!r} but the data is grouped by {names[0]!r}")
    return data._df, names[0]


def _key_kind(df: Any, key: str) -> str:
    from pyspark.sql import types as T

    if key not in df.columns:
        raise ConfigError(f"key column {key!r} is not in {df.columns}")
    dtype = df.schema[key].dataType
    if isinstance(dtype, T.StringType):
        return "string"
    if isinstance(dtype, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return "integer"
    raise ConfigError(f"key column {key!r} is {dtype.simpleString()}: use a string or integer key")


def _time_mode(value: str) -> str:
    try:
        return time_mode_of(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _event_time(df: Any, mode: str, column: str | None, delay: str | None) -> Any:
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


def _initial(initial_state: Any, key: str, df: Any) -> tuple[Any, tuple[str, ...] | None, Any]:
    """The initial state as rows to route (key, ``INIT_COLUMN`` struct), its columns, the struct."""
    if initial_state is None:
        return None, None, None
    from pyspark.sql import GroupedData
    from pyspark.sql import functions as F

    init_df, init_key = (
        _grouping(initial_state, key)
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


class _Unbound:
    """A state variable declared in the driver's check of ``init``: not usable there.

    Every attribute raises. Driver thread only (the check's).
    """

    def __getattr__(self, name: str) -> Any:
        raise InvalidArgument(
            "state is used in handleInputRows and handleExpiredTimer, not in init"
        )


class _DeclarationCheck:
    """A handle for the driver's run of ``init``: checks every declaration, keeps nothing.

    Invariant: the handle's rules (names, one kind per name, TTL needs a time
    mode, no timers without a key). The caller's thread only.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.kinds: dict[str, tuple[Any, ...]] = {}
        #: names ``init`` deletes (``deleteIfExists``)
        self.deleted: list[str] = []

    def schemas(self, key: str, key_type: str) -> OperatorSchemas:
        """The declared states as the schema document the checkpoints record."""
        states: dict[str, tuple[str, str, str | None, int | None]] = {}
        for name, sig in self.kinds.items():
            if sig[0] == "map":
                states[name] = ("map", sig[2].json(), sig[1].json(), sig[3])
            else:
                states[name] = (sig[0], sig[1].json(), None, sig[2])
        return declared_of(key, key_type, states)

    def _declare(self, name: str, signature: tuple[Any, ...], ttl: int | None) -> _Unbound:
        check_state_name(name)
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
                raise InvalidArgument(f"state {name!r}: ttlDurationMs must be a positive int")
            if self.mode == "None":
                raise InvalidArgument(
                    f"state {name!r} has a TTL: use time mode ProcessingTime or EventTime"
                )
        old = self.kinds.setdefault(name, signature)
        if old != signature:
            raise InvalidArgument(f"state {name!r} is declared twice, differently")
        return _Unbound()

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        return self._declare(
            stateName, ("value", RowCodec(schema).schema, ttlDurationMs), ttlDurationMs
        )

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        return self._declare(
            stateName, ("list", RowCodec(schema).schema, ttlDurationMs), ttlDurationMs
        )

    def getMapState(
        self,
        stateName: str,
        userKeySchema: Any,
        valueSchema: Any,
        ttlDurationMs: int | None = None,
    ) -> Any:
        signature = (
            "map",
            RowCodec(userKeySchema).schema,
            RowCodec(valueSchema).schema,
            ttlDurationMs,
        )
        return self._declare(stateName, signature, ttlDurationMs)

    def deleteIfExists(self, stateName: str) -> None:
        check_state_name(stateName)
        self.deleted.append(stateName)

    def _no_key(self, *args: Any) -> Any:
        raise InvalidArgument("timers belong to a key: use them in the handlers, not in init")

    registerTimer = deleteTimer = listTimers = _no_key


def _check_processor(processor: Any, mode: str) -> _DeclarationCheck:
    """Spark's driver-side ``init``: on a copy, with a handle that only checks declarations
    (and keeps them: the states' schemas)."""
    from pyspark import cloudpickle

    for method in ("init", "handleInputRows"):
        if not callable(getattr(processor, method, None)):
            raise ConfigError(f"the processor has no {method}() (a StatefulProcessor)")
    probe = cloudpickle.loads(cloudpickle.dumps(processor))  # type: ignore[no-untyped-call]
    declared = _DeclarationCheck(mode)
    try:
        probe.init(declared)
        probe.close()
    except InvalidArgument as exc:
        raise ConfigError(f"the processor's init(): {exc.message}") from None
    return declared
