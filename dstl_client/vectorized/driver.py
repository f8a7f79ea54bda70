"""The driver side of a vectorized query: its stage on the batch cycle, its batches' times.

:func:`start_query` starts a planned operator when its output is written
(the ``writeStream`` builder of :mod:`dstl_client.processor.writer` calls it):
the options merged as for ``transform_with_state``
(:func:`dstl_client.processor.conf.merged_options`), the sink made by
:func:`dstl_client.processor.sinks.make_sink`, and one stage on the keyed
batch cycle (:func:`dstl_client.batch.cycle.run_keyed_query`).
:class:`VectorDriver` is the stage's side of each batch, on the
``foreachBatch`` thread: the key-group column added in SQL (the routing's
expression), the batch's times read from Spark's offsets log
(:mod:`dstl_client.processor.times`), and the tasks' figures summed into
the query's progress after the checkpoint record.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from dstl_client.batch.cycle import BatchHooks, run_keyed_query
from dstl_client.batch.options import KeyedOptions, default_job_id
from dstl_client.batch.routing import KeyedSchemas, TaskFunction
from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.keygroups import key_group_sql
from dstl_client.processor.conf import writer_query_options
from dstl_client.processor.progress import ProcessorQuery
from dstl_client.processor.sinks import WriteSpec, make_sink
from dstl_client.processor.stats import BatchFigures, ProcessorStats
from dstl_client.processor.times import BatchTimes, batch_times
from dstl_client.vectorized.keys import KG_COLUMN
from dstl_client.vectorized.spec import VectorSpec
from dstl_client.vectorized.task import vector_task


@dataclass(frozen=True, slots=True)
class VectorPlan:
    """One vectorized operator as ``transform_batches`` planned it. Frozen: the user's thread."""

    spec: VectorSpec
    #: the user's function, pickled (cloudpickle)
    fn: bytes
    schemas: KeyedSchemas
    #: the streaming input (watermark applied)
    source: Any
    #: the keyword options given to ``transform_batches``
    options: dict[str, Any]
    config: KeyedOptions | None


def start_query(
    plan: VectorPlan, write: WriteSpec, query_options: dict[str, Any]
) -> ProcessorQuery:
    """Start the query of ``plan``; its output goes where ``write`` says."""
    session = plan.source.sparkSession
    opts = writer_query_options(
        "transform_batches", session, plan.config, plan.options, query_options
    )
    sink = make_sink(
        write,
        app_id=opts.job_id or default_job_id(opts.checkpoint_dir),
        session=session,
        schema=plan.schemas.user,
    )
    return VectorDriver(plan, opts).start(sink)


class VectorDriver:
    """The driver side of one vectorized query's batches (see the module documentation).

    Invariant: a batch's times come from Spark's offsets log, never from the
    clock, so a re-run batch has the times of its first run. Thread: the
    ``foreachBatch`` thread (one batch at a time); :meth:`start` the user's.
    """

    def __init__(self, plan: VectorPlan, opts: KeyedOptions) -> None:
        self.plan = plan
        self.opts = opts
        self.query: ProcessorQuery | None = None
        self._times: dict[int, BatchTimes] = {}

    def start(self, sink: Any) -> ProcessorQuery:
        plan = self.plan
        session = plan.source.sparkSession

        def handle(coordinator: CheckpointCoordinator, port: int | None) -> ProcessorQuery:
            self.query = ProcessorQuery(coordinator, port)
            self.query.listen(session)
            return self.query

        try:
            query = run_keyed_query(
                plan.source,
                key=plan.spec.key,
                schemas=plan.schemas,
                hooks=BatchHooks(
                    make_task=self.make_task, prepare=self.prepare, recorded=self.recorded
                ),
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

    def times_of(self, session: Any, batch_id: int) -> BatchTimes:
        """The batch's times from Spark's offsets log (nothing to read in time mode None)."""
        spec = self.plan.spec
        event_time = spec.event_time_column is not None
        if spec.time_mode == "None" and not event_time:
            return BatchTimes()
        return batch_times(self.opts.spark_checkpoint_dir, batch_id, session, event_time=event_time)

    def prepare(self, batch_df: Any, batch_id: int, plan: BatchPlan) -> Any:
        """The batch's rows with their key group (the routing's SQL expression)."""
        from pyspark.sql import functions as F

        kg = F.expr(key_group_sql(self.plan.spec.key, plan.max_parallelism)).cast("int")
        return batch_df.withColumn(KG_COLUMN, kg)

    def make_task(self, plan: BatchPlan, batch_df: Any, batch_id: int) -> TaskFunction:
        times = self.times_of(batch_df.sparkSession, batch_id)
        self._times = {batch_id: times}
        spec = self.plan.spec
        return functools.partial(
            vector_task, spec, self.plan.fn, plan, times, self.plan.schemas.arrow
        )

    def recorded(self, batch_id: int, extras: list[bytes | None]) -> None:
        times = self._times.get(batch_id, BatchTimes())
        query = self.query
        if query is None:
            return
        history = query.coordinator.history
        checkpoint = history[-1] if history and history[-1].batch_id == batch_id else None
        tasks = [ProcessorStats() if e is None else ProcessorStats.from_bytes(e) for e in extras]
        query.record(
            BatchFigures.of(batch_id, times.processing_ms, times.watermark_ms, tasks, checkpoint)
        )
