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
``transformWithState`` (``use_pandas=False``) on dstl's batch cycle
(:class:`~dstl_client.batch.cycle.BatchCycle`): rows routed by key group,
one :func:`~.task.processor_task` per partition, every state change (timers
and TTL index included) logged to the DSTL and checkpointed. Here the
arguments are checked and the stage planned (:class:`~.driver.StagePlan`);
the query starts when the output is written (:func:`~.driver.start_output`).
A bounded input runs in sorted mode (:mod:`dstl_client.bounded`).
"""

from __future__ import annotations

from typing import Any

from dstl_client.batch.inputs import grouping, key_kind
from dstl_client.batch.options import KeyedOptions
from dstl_client.batch.routing import keyed_schemas
from dstl_client.bounded.dataframe import process_bounded, sorted_mode
from dstl_client.core.errors import ConfigError
from dstl_client.extras import require_spark
from dstl_client.keywords import check_keywords
from dstl_client.processor.arguments import (
    inherited_event_time,
    initial_rows,
    time_mode_arg,
    upstream_of,
    with_event_time,
)
from dstl_client.processor.declarations import check_processor
from dstl_client.processor.driver import STAGE_OPTIONS, StagePlan, start_output
from dstl_client.processor.pipeline import (
    ProcessorOutput,
    Segment,
    check_output_event_time_column,
)
from dstl_client.processor.runner import KEY_DECODERS, ProcessorTask
from dstl_client.processor.task import ProcessorTaskSpec
from dstl_client.processor.writer import OUTPUT_MODES

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

    How the query runs is a :class:`~dstl_client.batch.options.KeyedOptions`:
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

    check_keywords("transform_with_state", options, KeyedOptions)
    mode = time_mode_arg(time_mode)
    found = upstream_of(data, key)
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
        event_time_column = inherited_event_time(upstream, mode, event_time_column, watermark_delay)
    else:
        df, key = grouping(data, key)
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
        df = with_event_time(df, mode, event_time_column, watermark_delay)
    kind = key_kind(df, key)
    if output_mode.lower() not in OUTPUT_MODES:
        raise ConfigError(f"output mode {output_mode!r}: a processor supports Append or Update")
    if late_rows not in LATE_ROWS:
        raise ConfigError(f"late_rows={late_rows!r}: use one of {LATE_ROWS}")
    declared = check_processor(processor, mode)
    schemas = keyed_schemas(output_schema)
    if output_event_time_column is not None:
        check_output_event_time_column(schemas.user, output_event_time_column)
        if event_time_column is None:
            raise ConfigError(
                "output_event_time_column carries the input's watermark to the stages after; "
                "the input has none: give event_time_column (and watermark_delay)"
            )
    initial_df, initial_columns, init_type = initial_rows(initial_state, key, df)
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
