"""``process_chain``: several keyed operators chained in one streaming query.

::

    from dstl_client.spark import KeyedStage, process_chain

    q = process_chain(
        clicks,
        stages=[
            KeyedStage("per-user", key="user", fn=count_per_user,
                       output_schema="user string, bucket long"),
            KeyedStage("per-bucket", key="bucket", fn=users_per_bucket,
                       output_schema="bucket long, users long"),
        ],
        parallelism=2, checkpoint_dir="/data/ckpt/clicks",
        sink=lambda out, batch_id: ...,
    )

Stage ``i + 1`` reads the output rows of stage ``i`` of the same micro-batch
(re-keyed by its own key column); the sink gets the last stage's rows. Each
stage is a keyed operator of the job with its own ``operator_id``: its own
state, subtasks (``parallelism`` may differ per stage), checkpoint records,
materializations and cleanup, exactly as if it ran alone (the job's orphan
sweep and retention already count every operator's records).

**How one batch stays exactly-once across the chain.** Records are written
once and never overwritten, so the stages of batch ``N`` cannot be committed
in one write. They are written **downstream first** (last stage, ..., first
stage) and only after the sink returned. Invariant: if stage ``i`` has a
record of ``N``, every later stage has one too. So when a crash leaves the
batch half-recorded, the stages without a record of ``N`` are a prefix; the
re-run of ``N`` (Spark re-runs an uncommitted batch with the same input)
runs that prefix only, from each stage's last record, and records it. If the
last stage already had its record the sink already got the batch: the
prefix's output is not passed on again. As for any replay, this needs the
stage functions to be deterministic (the same input and state give the same
output), the contract of Spark's own stateful operators.

Threads: the driver's ``foreachBatch`` thread runs batches one at a time;
:meth:`ChainQuery.stop` runs on the user's thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.core.errors import ConfigError
from dstl_client.extras import require_spark
from dstl_client.spark.keyed import (
    BatchHooks,
    KeyedSchemas,
    TaskFunction,
    keyed_schemas,
    route_and_map,
    start_query,
)
from dstl_client.spark.options import KeyedOptions
from dstl_client.spark.query import DstlQuery, QueryStopping, source_progress
from dstl_client.spark.task import META_COLUMN, RESERVED_COLUMNS, RESULT_COLUMNS, keyed_task
from dstl_client.state.subtask import KeyedFunction

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeyedStage:
    """One keyed operator of a chain: ``fn(key, rows, ctx)`` per key, as in ``process_keyed``.

    ``operator_id`` names its state and records (unique in the job, and fixed
    for the job's life, like the order of the stages). ``parallelism``
    defaults to the chain's. Frozen: any thread.
    """

    operator_id: str
    key: str
    fn: KeyedFunction
    #: the stage's output rows (DDL or ``StructType``): the next stage's input
    output_schema: Any
    parallelism: int | None = None


class ChainQuery(DstlQuery):
    """A running chain: one Spark query, one coordinator per stage.

    ``coordinator`` is the first stage's, which records last: a batch is
    checkpointed in the whole chain once it has its record (``wait_for_batch``).
    Threads as :class:`DstlQuery`.
    """

    def __init__(self, coordinators: list[CheckpointCoordinator], metrics_port: int | None) -> None:
        super().__init__(coordinators[0], metrics_port)
        self.coordinators = coordinators

    def stop(self, timeout_s: float = 120.0, *, cancel: bool = False) -> None:
        """Stop the query between two batches (see :meth:`DstlQuery.stop`), then every stage.

        ``cancel=True`` with ``retain_on_cancel=False`` disposes of every
        stage's checkpoints (its records and the objects only they use).
        """
        try:
            super().stop(timeout_s, cancel=cancel)  # the first stage's writers and coordinator
        finally:
            for coordinator in self.coordinators[1:]:
                try:
                    coordinator.close_writers()
                    if cancel and not coordinator.config.retain_on_cancel:
                        coordinator.dispose()
                finally:
                    coordinator.close()


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One keyed operator as :func:`run_chain` runs it. Frozen: any thread.

    ``opts`` are the stage's (its ``operator_id`` and ``parallelism``);
    ``hooks`` what runs in and around its tasks, as for
    :func:`~dstl_client.spark.keyed.run_keyed_query` (``make_task`` and
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
class _Stage:
    """A stage as the chain runs it: its link and coordinator."""

    link: ChainLink
    coordinator: CheckpointCoordinator


def process_chain(
    df: Any,
    *,
    stages: list[KeyedStage],
    sink: Callable[[Any, int], None] | None = None,
    config: KeyedOptions | None = None,
    **options: Any,
) -> ChainQuery:
    """Run ``stages`` one after the other on every micro-batch of the streaming ``df``.

    ``config``/``options`` are those of ``process_keyed`` for the whole chain
    (``parallelism``, ``checkpoint_dir`` required); each stage overrides the
    operator id and, if it sets one, the parallelism. The sink gets the last
    stage's output. Returns the started :class:`ChainQuery`.
    """
    require_spark("process_chain")
    opts = KeyedOptions.of(config, options)
    if not stages:
        raise ConfigError("a chain needs at least one stage")
    columns: list[str] = list(df.columns)
    links: list[ChainLink] = []
    for stage in stages:
        if stage.key not in columns:
            raise ConfigError(
                f"stage {stage.operator_id!r}: key column {stage.key!r} is not in {columns}"
            )
        schemas = keyed_schemas(stage.output_schema)
        links.append(
            ChainLink(
                opts=stage_options(opts, stage.operator_id, stage.parallelism),
                key=stage.key,
                schemas=schemas,
                hooks=BatchHooks(make_task=functools.partial(_keyed_task_of, stage, schemas)),
            )
        )
        columns = [f.name for f in schemas.user.fields]
    return run_chain(df, links, sink=sink, opts=opts)


def _keyed_task_of(
    stage: KeyedStage, schemas: KeyedSchemas, plan: BatchPlan, rows: Any, batch_id: int
) -> TaskFunction:
    """A :class:`KeyedStage`'s ``mapInArrow`` function of a batch (its input: ``rows``)."""
    return functools.partial(
        keyed_task, plan, stage.key, stage.fn, list(rows.columns), schemas.arrow
    )


def stage_options(opts: KeyedOptions, operator_id: str, parallelism: int | None) -> KeyedOptions:
    """A chain stage's options: the chain's, with the stage's operator id and parallelism.

    The chain serves no metrics or REST port of its own per stage.
    """
    return dataclasses.replace(
        opts,
        operator_id=operator_id,
        parallelism=parallelism or opts.parallelism,
        metrics_port=None,
        config_port=None,
    )


def run_chain(
    df: Any,
    links: list[ChainLink],
    *,
    sink: Callable[[Any, int], None] | None,
    opts: KeyedOptions,
    handle_factory: Callable[[list[CheckpointCoordinator], int | None], ChainQuery] = ChainQuery,
) -> ChainQuery:
    """The batch cycle of a chain (see the module documentation) over ``links``.

    ``opts`` are the chain's: its Spark checkpoint, trigger, query name and
    ``start``. ``handle_factory(coordinators, metrics_port)`` makes the
    returned handle (a :class:`ChainQuery` or a subclass). Returns it, started
    unless ``opts.start`` is false.
    """
    from pyspark.sql import functions as F

    if not links:
        raise ConfigError("a chain needs at least one stage")
    if opts.restore_from is not None:
        raise ConfigError(
            "restore_from is not supported by a chain (its stages and its Spark "
            "checkpoint would have to be rolled back together)"
        )
    ids = [link.opts.operator_id for link in links]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"the stages' operator ids must differ: {ids}")
    if opts.on_phase is not None:
        raise ConfigError("on_phase is not supported by a chain")
    for reserved in RESERVED_COLUMNS:
        if reserved in df.columns:
            raise ConfigError(f"column name {reserved!r} is reserved")
    planned: list[_Stage] = []
    try:
        for link in links:
            link.opts.validate()
            for reserved in RESERVED_COLUMNS:
                if reserved in link.schemas.user.fieldNames():
                    raise ConfigError(f"column name {reserved!r} is reserved")
            coordinator = CheckpointCoordinator(link.opts.coordinator_config())
            planned.append(_Stage(link, coordinator))
            coordinator.start()
            if link.hooks.state_schemas is not None:  # before the first batch
                coordinator.adopt_schemas(link.hooks.state_schemas, link.hooks.deleted_states)
    except BaseException:
        for p in planned:
            p.coordinator.close()
        raise
    handle = handle_factory([p.coordinator for p in planned], None)
    job_id = planned[0].coordinator.config.job_id
    running: dict[int, tuple[Any, str]] = {}

    def abort(batch_id: int) -> None:
        found = running.get(batch_id)
        if found is not None:
            found[0].interruptTag(found[1])

    for p in planned:
        p.coordinator.on_timeout = abort
        p.coordinator.start_watchdog()
    spark_checkpoint = opts.spark_checkpoint_dir
    is_result = F.col(META_COLUMN).isNotNull()

    def run_batch(batch_df: Any, batch_id: int) -> None:
        if handle.halted:
            raise QueryStopping(f"batch {batch_id} not run: the query is stopping")
        with handle.in_batch:
            if handle.halted:  # a trigger switch began while this batch waited
                raise QueryStopping(f"batch {batch_id} not run: the query is stopping")
            started = time.monotonic()
            plans: list[BatchPlan] = []
            for p in planned:  # the stages without a record of the batch: a prefix
                plan = p.coordinator.plan_batch(batch_id, p.link.opts.parallelism)
                if plan is None:
                    break
                plans.append(plan)
            if not plans:
                return
            session = batch_df.sparkSession
            tag = f"dstl-{job_id}-{batch_id}"
            session.addTag(tag)
            running[batch_id] = (session, tag)
            cached: list[Any] = []
            try:
                rows = batch_df
                results: list[list[TaskResult]] = []
                extras: list[list[bytes | None]] = []
                for p, plan in zip(planned, plans, strict=False):
                    link = p.link
                    hooks = link.hooks
                    stage_rows = (
                        rows if hooks.prepare is None else hooks.prepare(rows, batch_id, plan)
                    )
                    mapped = route_and_map(
                        stage_rows,
                        key=link.key,
                        parallelism=link.opts.parallelism,
                        max_parallelism=link.opts.max_parallelism,
                        task=hooks.make_task(plan, rows, batch_id),
                        schemas=link.schemas,
                    ).persist()
                    cached.append(mapped)
                    metas = mapped.where(is_result).select(*RESULT_COLUMNS).collect()
                    results.append([TaskResult.from_bytes(bytes(r[0])) for r in metas])
                    extras.append([None if r[1] is None else bytes(r[1]) for r in metas])
                    rows = mapped.where(~is_result).drop(*RESULT_COLUMNS)
                    if link.after is not None:
                        rows = link.after(rows, batch_id)
                if len(plans) == len(planned) and sink is not None:
                    sink(rows, batch_id)
                elif len(plans) < len(planned):
                    log.info(
                        "batch %d re-ran stages %s; the later stages had recorded it",
                        batch_id,
                        [p.link.opts.operator_id for p in planned[: len(plans)]],
                    )
                progress = source_progress(spark_checkpoint, batch_id)
                for i in reversed(range(len(plans))):  # downstream first
                    planned[i].coordinator.complete_batch(
                        plans[i], results[i], source_progress=progress, started_monotonic=started
                    )
                for p, stage_extras in zip(planned, extras, strict=False):
                    if p.link.hooks.recorded is not None:
                        p.link.hooks.recorded(batch_id, stage_extras)
            finally:
                for mapped in cached:
                    mapped.unpersist()
                running.pop(batch_id, None)
                session.removeTag(tag)
                for p, plan in zip(planned, plans, strict=False):
                    p.coordinator.end_batch(plan.batch_id)

    if opts.start:
        first = planned[0].coordinator
        handle.restart = functools.partial(start_query, df, run_batch, opts)
        first.on_interval_change = handle.change_interval  # the chain's interval: the first stage's
        try:
            handle.query = start_query(df, run_batch, opts, first.config.checkpoint_interval_s)
        except BaseException:
            for p in planned:
                with contextlib.suppress(Exception):
                    p.coordinator.close()
            raise
    return handle
