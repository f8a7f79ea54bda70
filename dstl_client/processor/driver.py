"""The driver side of a processor query: its stages started on the batch cycle, their batches.

:func:`start_output` starts a planned :class:`~.pipeline.ProcessorOutput`
when it is written: one stage on the keyed batch cycle
(:func:`~dstl_client.batch.cycle.run_keyed_query`), more as a chain
(:func:`~dstl_client.batch.cycle.run_chain`). :class:`ProcessorDriver` is
one stage's side of each batch (on the ``foreachBatch`` thread): read the
batch's times from Spark's offsets log (:mod:`.times`), add the initial
state to the first batch, and after the checkpoint record sum the tasks'
figures into the query's progress (:mod:`.progress`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from dstl_client.batch.cycle import BatchHooks, BatchStage, run_chain, run_keyed_query
from dstl_client.batch.options import KeyedOptions, default_job_id, stage_options
from dstl_client.batch.query import ChainQuery
from dstl_client.batch.routing import KeyedSchemas, TaskFunction
from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.state_schemas import OperatorSchemas
from dstl_client.processor.conf import writer_query_options
from dstl_client.processor.pipeline import (
    ProcessorOutput,
    apply_steps,
    check_event_times,
)
from dstl_client.processor.progress import ProcessorQuery
from dstl_client.processor.sinks import WriteSpec, make_sink
from dstl_client.processor.stats import BatchFigures
from dstl_client.processor.task import INIT_COLUMN, ProcessorTaskSpec, processor_task, stats_of
from dstl_client.processor.times import BatchTimes, batch_times

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
    opts = writer_query_options(
        "transform_with_state", session, first.config, first.options, query_options
    )
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
            BatchStage(
                opts=stage_opts,
                key=stage.spec.key,
                schemas=stage.schemas,
                hooks=driver.hooks(),
                after=stage_after,
            )
        )

    def handle(coordinators: list[CheckpointCoordinator], port: int | None) -> ProcessorChainQuery:
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
    return chain


class ProcessorChainQuery(ChainQuery, ProcessorQuery):
    """A running chain of processor stages: one Spark query, a coordinator per stage.

    Its progress carries the first stage's figures (``"dstl"``); threads as
    :class:`~dstl_client.batch.query.ChainQuery`.
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
