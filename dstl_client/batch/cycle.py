"""The batch cycle: how every keyed API runs one micro-batch, with its checkpoint.

``process_keyed`` (one stage), ``transform_with_state`` (one stage, or a
chain of them) and ``process_chain`` (N stages) all run their micro-batches
through one :class:`BatchCycle`, as Spark's ``foreachBatch`` function:

1. **plan**: each stage's :class:`~dstl_client.coordinator.CheckpointCoordinator`
   plans the batch, in stage order, or skips it when its checkpoint exists (a
   re-run after a crash between our record and Spark's commit). As records
   are written downstream first (3.), the stages without a record of the
   batch are a prefix; nothing planned: the batch was recorded.
2. **run**: each planned stage's rows are routed to its subtasks
   (:func:`~.routing.route_and_map`) and run through its tasks
   (``mapInArrow``: one :class:`~dstl_client.state.subtask.Subtask` per
   partition, its changes persisted before the task ends); the driver
   collects the result rows (``collect`` returns exactly one successful
   attempt per partition) and passes the output rows to the next stage. The
   last stage's go to ``sink``, unless a later stage had already recorded
   the batch (the sink got the batch then).
3. **complete**: the checkpoint records, keyed by the batch id, last stage
   first. Invariant: if stage ``i`` has a record of a batch, every later
   stage has one too. Only then does the function return and Spark commit
   the batch.

A restarted query re-runs its uncommitted batch with the same id and input;
tasks bring their stores back to the last recorded checkpoint first, so the
state is exactly-once (the stage functions must be deterministic, as for any
replay). A checkpoint failure (timed out and aborted by the watchdog,
incomplete task results, a record not written) is tolerated up to
``tolerable_failed_checkpoints`` times in a row
(:mod:`dstl_client.coordinator.failures`): the batch is planned and run
again, from each stage's last record. Other errors fail the batch.

What a kind of operator runs in and around its tasks is its
:class:`BatchHooks`: ``process_keyed`` runs ``fn`` per key
(:func:`dstl_client.spark.task.keyed_task`), :mod:`dstl_client.processor`
a ``StatefulProcessor`` with timers and TTL.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dstl_client.batch.columns import META_COLUMN, RESULT_COLUMNS
from dstl_client.batch.inputs import check_key_column, check_reserved
from dstl_client.batch.jobs import BatchJobs
from dstl_client.batch.options import KeyedOptions
from dstl_client.batch.query import DstlQuery, QueryStopping, source_progress, start_query
from dstl_client.batch.routing import KeyedSchemas, TaskFunction, route_and_map
from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.failures import CheckpointFailures
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.coordinator.state_schemas import OperatorSchemas
from dstl_client.core.errors import ConfigError

log = logging.getLogger(__name__)

Q = TypeVar("Q", bound=DstlQuery)


@dataclass(frozen=True, slots=True)
class BatchHooks:
    """What a kind of keyed operator adds to the batch cycle.

    Called on the driver's ``foreachBatch`` thread, one batch at a time.
    """

    #: ``make_task(plan, batch_df, batch_id)``: the ``mapInArrow`` function of the batch
    make_task: Callable[[BatchPlan, Any, int], TaskFunction]
    #: ``prepare(batch_df, batch_id, plan)``: the rows the batch routes (default: ``batch_df``)
    prepare: Callable[[Any, int, BatchPlan], Any] | None = None
    #: ``recorded(batch_id, extras)``: after the checkpoint record, the tasks'
    #: ``EXTRA_COLUMN`` values (one per task, ``None`` where a task sent none)
    recorded: Callable[[int, list[bytes | None]], None] | None = None
    #: the states' declared schemas, checked against the checkpoint's and recorded at start
    #: (:mod:`dstl_client.coordinator.state_schemas`); ``None``: nothing declared up front
    state_schemas: OperatorSchemas | None = None
    #: states the operator deletes at start (their recorded schemas are dropped)
    deleted_states: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchStage:
    """One keyed operator as the batch cycle runs it. Frozen: any thread.

    ``opts`` are the stage's (its ``operator_id``, ``parallelism``, checkpoint
    tunables); ``hooks`` what runs in and around its tasks (``make_task`` and
    ``prepare`` get the stage's input rows of the batch, ``recorded`` is
    called once every stage recorded the batch); ``after(rows, batch_id)``
    turns the stage's output rows into what the next stage (or the sink)
    reads, on the driver (checks, stateless steps).
    """

    opts: KeyedOptions
    key: str
    schemas: KeyedSchemas
    hooks: BatchHooks
    after: Callable[[Any, int], Any] | None = None


@dataclass(frozen=True, slots=True)
class StageResults:
    """What one stage's tasks of a batch reported, one entry per task. Frozen: any thread."""

    results: list[TaskResult]
    #: the tasks' ``EXTRA_COLUMN`` values (``None`` where a task sent none)
    extras: list[bytes | None]

    @classmethod
    def of(cls, rows: list[Any]) -> StageResults:
        """From the collected result rows (``RESULT_COLUMNS``)."""
        return cls(
            results=[TaskResult.from_bytes(bytes(r[0])) for r in rows],
            extras=[None if r[1] is None else bytes(r[1]) for r in rows],
        )


class BatchCycle(Generic[Q]):
    """One streaming query's batches over ``stages`` (see the module documentation).

    Invariants: at most one batch runs at a time (the handle's ``in_batch``);
    no batch starts once the handle halted; a batch's records are written
    last stage first, only after the sink returned. The coordinators are
    started here and closed by the handle's ``stop`` (or here, when starting
    fails). Threads: construction and :meth:`start` on the user's thread;
    :meth:`run_batch` and its steps on Spark's ``foreachBatch`` thread;
    :meth:`abort` on a coordinator's watchdog thread.
    """

    def __init__(
        self,
        df: Any,
        stages: list[BatchStage],
        *,
        sink: Callable[[Any, int], None] | None,
        opts: KeyedOptions,
        handle_factory: Callable[[list[CheckpointCoordinator], int | None], Q],
    ) -> None:
        if not stages:
            raise ConfigError("a query needs at least one stage")
        self.df = df
        self.stages = stages
        self.sink = sink
        #: the query's options: its Spark checkpoint, trigger, name, ``start``, ``on_phase``
        self.opts = opts
        self.coordinators = _open_coordinators(stages)
        first, front = self.coordinators[0], stages[0].opts
        port = (
            first.metrics.serve(front.metrics_port, front.metrics_host)
            if front.metrics_port is not None
            else None
        )
        self.handle: Q = handle_factory(self.coordinators, port)
        if front.config_port is not None:
            self.handle.config_server = CheckpointConfigServer(
                front.config_host, front.config_port, token=front.config_token
            )
            self.handle.config_server.register(first)
        self.job_id = first.config.job_id
        #: the Spark jobs of the batch in flight, cancelled by :meth:`abort`
        self.jobs = BatchJobs(self.job_id)
        for coordinator in self.coordinators:
            coordinator.on_timeout = self.abort
            coordinator.start_watchdog()
        self.failures = CheckpointFailures(lambda: first.config.tolerable_failed_checkpoints)
        self.handle.failures = self.failures

    def start(self) -> Q:
        """Start the Spark query (unless ``opts.start`` is false); the handle."""
        handle = self.handle
        if self.opts.start:
            first = self.coordinators[0]  # the query's interval: the first stage's
            handle.restart = functools.partial(start_query, self.df, self.run_batch, self.opts)
            first.on_interval_change = handle.change_interval
            try:
                handle.query = start_query(
                    self.df, self.run_batch, self.opts, first.config.checkpoint_interval_s
                )
            except BaseException:
                for coordinator in self.coordinators:
                    with contextlib.suppress(Exception):
                        coordinator.close()
                raise
        return handle

    def abort(self, batch_id: int) -> None:
        """Cancel the Spark jobs of ``batch_id``, their tasks interrupted (its checkpoint
        timed out): its ``run`` raises, and the batch runs again (:mod:`.jobs`)."""
        self.jobs.cancel(batch_id)

    # ------------------------------------------------------------ one batch
    def run_batch(self, batch_df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` function: plan, run, complete; again after a tolerated failure."""
        handle = self.handle
        if handle.halted:
            raise QueryStopping(f"batch {batch_id} not run: the query is stopping")
        with handle.in_batch:
            if handle.halted:  # a trigger switch began while this batch waited
                raise QueryStopping(f"batch {batch_id} not run: the query is stopping")
            while True:  # again after a tolerated checkpoint failure (see .failures)
                started = time.monotonic()
                plans = self.plan(batch_id)
                if not plans:
                    return
                self._phase("planned", batch_id)
                try:
                    with self.jobs.running(batch_df.sparkSession.sparkContext, batch_id):
                        results = self.run(batch_df, batch_id, plans)
                        self._phase("tasks_done", batch_id)
                        self.complete(batch_id, plans, results, started)
                except Exception as exc:
                    planned = self.coordinators[: len(plans)]
                    aborted = any(c.was_aborted(batch_id) for c in planned)
                    if handle.halted or not self.failures.retry(batch_id, exc, aborted=aborted):
                        raise
                    continue
                finally:
                    for coordinator, plan in zip(self.coordinators, plans, strict=False):
                        coordinator.end_batch(plan.batch_id)
                self.failures.succeeded()
                return

    def plan(self, batch_id: int) -> list[BatchPlan]:
        """The plans of the stages without a record of ``batch_id`` (a prefix of the stages)."""
        plans: list[BatchPlan] = []
        for stage, coordinator in zip(self.stages, self.coordinators, strict=True):
            plan = coordinator.plan_batch(batch_id, stage.opts.parallelism)
            if plan is None:
                break
            plans.append(plan)
        return plans

    def run(self, batch_df: Any, batch_id: int, plans: list[BatchPlan]) -> list[StageResults]:
        """Run the planned stages on the batch's rows, the sink on the last one's; their results.

        A stage's mapped rows are cached while something reads them after
        the results are collected (the next stage, ``after``, the sink), so
        its tasks run once.
        """
        from pyspark.sql import functions as F

        is_result = F.col(META_COLUMN).isNotNull()
        whole = len(plans) == len(self.stages)
        rows = batch_df
        results: list[StageResults] = []
        cached: list[Any] = []
        try:
            for i, (stage, plan) in enumerate(zip(self.stages, plans, strict=False)):
                hooks = stage.hooks
                stage_rows = rows if hooks.prepare is None else hooks.prepare(rows, batch_id, plan)
                mapped = route_and_map(
                    stage_rows,
                    key=stage.key,
                    parallelism=stage.opts.parallelism,
                    max_parallelism=stage.opts.max_parallelism,
                    task=hooks.make_task(plan, rows, batch_id),
                    schemas=stage.schemas,
                )
                last = i + 1 == len(plans)
                if not last or stage.after is not None or (whole and self.sink is not None):
                    mapped = mapped.persist()
                    cached.append(mapped)
                results.append(
                    StageResults.of(mapped.where(is_result).select(*RESULT_COLUMNS).collect())
                )
                rows = mapped.where(~is_result).drop(*RESULT_COLUMNS)
                if stage.after is not None:
                    rows = stage.after(rows, batch_id)
            if whole and self.sink is not None:
                self.sink(rows, batch_id)
            elif not whole:
                log.info(
                    "batch %d re-ran stages %s; the later stages had recorded it",
                    batch_id,
                    [s.opts.operator_id for s in self.stages[: len(plans)]],
                )
        finally:
            for frame in cached:
                frame.unpersist()
        return results

    def complete(
        self, batch_id: int, plans: list[BatchPlan], results: list[StageResults], started: float
    ) -> None:
        """Write the planned stages' records, last stage first; then their ``recorded`` hooks."""
        progress = source_progress(self.opts.spark_checkpoint_dir, batch_id)
        for i in reversed(range(len(plans))):  # downstream first
            self.coordinators[i].complete_batch(
                plans[i], results[i].results, source_progress=progress, started_monotonic=started
            )
        self._phase("recorded", batch_id)
        for stage, stage_results in zip(self.stages, results, strict=False):
            if stage.hooks.recorded is not None:
                stage.hooks.recorded(batch_id, stage_results.extras)

    def _phase(self, phase: str, batch_id: int) -> None:
        if self.opts.on_phase is not None:
            self.opts.on_phase(phase, batch_id)


def _open_coordinators(stages: list[BatchStage]) -> list[CheckpointCoordinator]:
    """Each stage's coordinator, started, its declared state schemas adopted (before the
    first batch: a mismatch fails here); all closed again if one fails."""
    opened: list[CheckpointCoordinator] = []
    try:
        for stage in stages:
            stage.opts.validate()
            coordinator = CheckpointCoordinator(stage.opts.coordinator_config())
            opened.append(coordinator)
            coordinator.start()
            if stage.hooks.state_schemas is not None:
                coordinator.adopt_schemas(stage.hooks.state_schemas, stage.hooks.deleted_states)
    except BaseException:
        for coordinator in opened:
            coordinator.close()  # its metadata store client and metrics server
        raise
    return opened


def run_keyed_query(
    df: Any,
    *,
    key: str,
    schemas: KeyedSchemas,
    hooks: BatchHooks,
    sink: Callable[[Any, int], None] | None,
    opts: KeyedOptions,
    handle_factory: Callable[[CheckpointCoordinator, int | None], Q],
) -> Q:
    """One keyed operator's query on the batch cycle; the handle ``handle_factory`` makes
    (``(coordinator, metrics_port)``: a :class:`DstlQuery` or a subclass)."""
    opts.validate()
    check_key_column(df, key)
    check_reserved(df.columns)
    stage = BatchStage(opts=opts, key=key, schemas=schemas, hooks=hooks)
    cycle = BatchCycle(
        df,
        [stage],
        sink=sink,
        opts=opts,
        handle_factory=lambda coordinators, port: handle_factory(coordinators[0], port),
    )
    return cycle.start()


def run_chain(
    df: Any,
    stages: list[BatchStage],
    *,
    sink: Callable[[Any, int], None] | None,
    opts: KeyedOptions,
    handle_factory: Callable[[list[CheckpointCoordinator], int | None], Q],
) -> Q:
    """A chain of keyed operators in one query on the batch cycle.

    ``opts`` are the chain's (its Spark checkpoint, trigger, query name,
    ``start``); each stage has its own. ``handle_factory(coordinators,
    metrics_port)`` makes the returned handle (a :class:`~.query.ChainQuery` or a
    subclass), started unless ``opts.start`` is false.
    """
    if not stages:
        raise ConfigError("a chain needs at least one stage")
    if opts.restore_from is not None:
        raise ConfigError(
            "restore_from is not supported by a chain (its stages and its Spark "
            "checkpoint would have to be rolled back together)"
        )
    ids = [stage.opts.operator_id for stage in stages]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"the stages' operator ids must differ: {ids}")
    if opts.on_phase is not None:
        raise ConfigError("on_phase is not supported by a chain")
    check_reserved(df.columns)
    for stage in stages:
        check_reserved(stage.schemas.user.fieldNames())
    return BatchCycle(df, stages, sink=sink, opts=opts, handle_factory=handle_factory).start()
