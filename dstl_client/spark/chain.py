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

from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.messages import BatchPlan, TaskResult
from dstl_client.core.errors import ConfigError
from dstl_client.spark.keyed import (
    KeyedSchemas,
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
class _Stage:
    """A stage as the chain runs it: its options, schemas, input columns, coordinator."""

    stage: KeyedStage
    opts: KeyedOptions
    schemas: KeyedSchemas
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
    from pyspark.sql import functions as F

    opts = KeyedOptions.of(config, options)
    if not stages:
        raise ConfigError("a chain needs at least one stage")
    if opts.restore_from is not None:
        raise ConfigError(
            "restore_from is not supported by process_chain (its stages and its Spark "
            "checkpoint would have to be rolled back together)"
        )
    ids = [s.operator_id for s in stages]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"the stages' operator ids must differ: {ids}")
    if opts.on_phase is not None:
        raise ConfigError("on_phase is not supported by a chain")
    columns: list[str] = list(df.columns)
    planned: list[_Stage] = []
    try:
        for stage in stages:
            stage_opts = dataclasses.replace(
                opts,
                operator_id=stage.operator_id,
                parallelism=stage.parallelism or opts.parallelism,
                metrics_port=None,
                config_port=None,
            )
            stage_opts.validate()
            if stage.key not in columns:
                raise ConfigError(
                    f"stage {stage.operator_id!r}: key column {stage.key!r} is not in {columns}"
                )
            for reserved in RESERVED_COLUMNS:
                if reserved in columns:
                    raise ConfigError(f"column name {reserved!r} is reserved")
            schemas = keyed_schemas(stage.output_schema)
            coordinator = CheckpointCoordinator(stage_opts.coordinator_config())
            planned.append(_Stage(stage, stage_opts, schemas, coordinator))
            coordinator.start()
            columns = [f.name for f in schemas.user.fields]
    except BaseException:
        for p in planned:
            p.coordinator.close()
        raise
    handle = ChainQuery([p.coordinator for p in planned], None)
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
                plan = p.coordinator.plan_batch(batch_id, p.opts.parallelism)
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
                for p, plan in zip(planned, plans, strict=False):
                    in_columns = list(rows.columns)
                    task = functools.partial(
                        keyed_task, plan, p.stage.key, p.stage.fn, in_columns, p.schemas.arrow
                    )
                    mapped = route_and_map(
                        rows,
                        key=p.stage.key,
                        parallelism=p.opts.parallelism,
                        max_parallelism=p.opts.max_parallelism,
                        task=task,
                        schemas=p.schemas,
                    ).persist()
                    cached.append(mapped)
                    metas = mapped.where(is_result).select(*RESULT_COLUMNS).collect()
                    results.append([TaskResult.from_bytes(bytes(r[0])) for r in metas])
                    rows = mapped.where(~is_result).drop(*RESULT_COLUMNS)
                if len(plans) == len(planned) and sink is not None:
                    sink(rows, batch_id)
                elif len(plans) < len(planned):
                    log.info(
                        "batch %d re-ran stages %s; the later stages had recorded it",
                        batch_id,
                        [p.stage.operator_id for p in planned[: len(plans)]],
                    )
                progress = source_progress(spark_checkpoint, batch_id)
                for i in reversed(range(len(plans))):  # downstream first
                    planned[i].coordinator.complete_batch(
                        plans[i], results[i], source_progress=progress, started_monotonic=started
                    )
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
