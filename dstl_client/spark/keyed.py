"""``process_keyed``: a keyed stateful function over a streaming DataFrame, state on the DSTL.

::

    from dstl_client.spark import process_keyed
    from dstl_client.state import INT64

    def count(key, rows, ctx):
        total = ctx.value_state("total", INT64)
        total.update((total.value() or 0) + len(rows))
        yield key, total.value()

    q = process_keyed(
        events, key="user", fn=count, output_schema="user string, total long",
        parallelism=4, checkpoint_dir="/data/ckpt/clicks", dstl_address="127.0.0.1:7070",
        sink=lambda out, batch_id: out.write.mode("append").parquet(f"/out/{batch_id}"),
    )

How a micro-batch runs (``foreachBatch``):

1. The driver's :class:`~dstl_client.coordinator.CheckpointCoordinator` plans
   the batch, or skips it when its checkpoint exists (a re-run after a crash
   between our record and Spark's commit).
2. The key group is computed in SQL (``pmod(crc32(key), max_parallelism)``,
   equal to the Python hash), each row goes to partition ``kg * p div
   max_parallelism`` with ``repartitionById``, plus one marker row per
   partition so every subtask runs even without data.
3. ``mapInArrow`` runs one :class:`~dstl_client.state.subtask.Subtask` per
   partition (:mod:`.task`): ``fn(key, rows, ctx)`` per key, state changes applied to the
   node-local store and appended to the DSTL, persisted before the task ends.
   Its output rows and one result row (handles, statistics) come back.
4. The driver collects the result rows (``collect`` returns exactly one
   successful attempt per partition), hands the output rows to ``sink``,
   and writes the checkpoint record keyed by the batch id. Only then does
   the function return and Spark commit the batch.

A restarted query re-runs its uncommitted batch with the same id and input;
tasks bring their stores back to the last recorded checkpoint first, so the
state is exactly-once. ``sink`` must tolerate a batch delivered again after a
crash (as with any ``foreachBatch`` sink: use the batch id).

How the query runs is one frozen :class:`~.options.KeyedOptions`
(``config=``); keyword arguments map onto its fields, so
``process_keyed(df, key="k", fn=f, parallelism=2, checkpoint_dir=...)`` works.

The cycle itself is :func:`run_keyed_query`; what runs in the tasks (and
around them on the driver) is its :class:`BatchHooks`: ``process_keyed``
runs ``fn`` per key (:func:`~.task.keyed_task`), :mod:`dstl_client.processor`
runs a ``StatefulProcessor`` with timers and TTL.

Requirements: PySpark >= 4.1 (``repartitionById``), pyarrow, this package
installed on the executors, ``PYSPARK_PYTHON`` pointing at that Python.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.failures import CheckpointFailures
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.coordinator.state_schemas import OperatorSchemas
from dstl_client.core.errors import ConfigError
from dstl_client.extras import require_spark
from dstl_client.keygroups import partition_sql
from dstl_client.spark.options import KeyedOptions
from dstl_client.spark.query import DstlQuery, QueryStopping, source_progress, trigger_of
from dstl_client.spark.task import (
    MARKER_COLUMN,
    META_COLUMN,
    PART_COLUMN,
    RESERVED_COLUMNS,
    RESULT_COLUMNS,
    keyed_task,
)
from dstl_client.state.subtask import KeyedFunction

log = logging.getLogger(__name__)


def process_keyed(
    df: Any,
    *,
    key: str,
    fn: KeyedFunction,
    output_schema: Any = None,
    sink: Callable[[Any, int], None] | None = None,
    config: KeyedOptions | None = None,
    execution_mode: str = "auto",
    **options: Any,
) -> Any:
    """Run ``fn(key, rows, ctx)`` per key and micro-batch, with keyed state on the DSTL.

    ``df`` is a streaming DataFrame with a string or integer column ``key``
    (rows with a null key are dropped). ``fn`` gets the key, that key's rows
    of the batch (dicts of the input columns, in arrival order) and a
    :class:`~dstl_client.state.KeyedContext`; it yields output rows (tuples or
    dicts) of ``output_schema`` (a ``StructType`` or DDL string), which go to
    ``sink(out_df, batch_id)`` once per batch.

    How it runs is ``config`` (a :class:`~.options.KeyedOptions`) with the
    keyword ``options`` applied to its fields (or only those: ``parallelism``
    and ``checkpoint_dir`` are required); an unknown keyword raises
    :class:`TypeError`. ``checkpoint_dir`` (a path or a URL Spark reads,
    e.g. ``s3a://bucket/ck``) holds Spark's checkpoint (``spark/``) and, by
    default, the job's checkpoint metadata (``dstl/``, ``s3://`` for an
    ``s3a://`` directory); ``metadata_url`` (a path, ``file:///...`` or
    ``s3://bucket/prefix``, with ``metadata_s3_endpoint_url`` and
    ``metadata_s3_region``) puts the metadata elsewhere. A driver restarted
    on another machine needs only that store, never its old disk; tasks
    never read it (the plan carries the last record). ``max_parallelism``
    (the number of key groups) is fixed for the job's life; ``parallelism``
    may change between runs. On start the driver removes orphans of a crash
    (the job's unreferenced objects older than ``orphan_grace_s``) through
    its sidecar. Progress is logged and exposed as Prometheus metrics on
    ``metrics_port``. A batch whose checkpoint takes longer than
    ``checkpoint_timeout_s`` is aborted (its Spark jobs interrupted; the
    query fails and re-runs it on restart). ``config_port`` serves the
    dynamic configuration REST endpoint (:mod:`dstl_client.coordinator.rest`)
    to change timeout and materialization interval while the query runs.
    ``on_phase(phase, batch_id)`` is called on the driver at ``"planned"``
    (before the tasks), ``"tasks_done"`` (results collected, sink called, no
    record yet) and ``"recorded"`` (record written, Spark not told yet).

    Returns a :class:`DstlQuery` (started unless ``start=False``). A bounded
    DataFrame (``df.isStreaming`` false, or ``execution_mode="sorted"``) runs
    in sorted single-key mode instead (:func:`dstl_client.bounded.process_bounded`:
    no checkpoints, no sidecar) and the result is a DataFrame.
    """
    require_spark("process_keyed")
    from dstl_client.bounded import process_bounded, sorted_mode  # here: an import cycle

    if sorted_mode(df, execution_mode):
        return process_bounded(
            df, key=key, fn=fn, output_schema=output_schema, sink=sink, config=config, **options
        )
    opts = KeyedOptions.of(config, options)
    schemas = keyed_schemas(output_schema)
    columns = list(df.columns)

    def make_task(plan: BatchPlan, batch_df: Any, batch_id: int) -> TaskFunction:
        return functools.partial(keyed_task, plan, key, fn, columns, schemas.arrow)

    return run_keyed_query(
        df, key=key, schemas=schemas, hooks=BatchHooks(make_task=make_task), sink=sink, opts=opts
    )


#: a batch's ``mapInArrow`` function: Arrow batches of one partition in, out
TaskFunction = Callable[[Iterator[Any]], Iterator[Any]]


@dataclass(frozen=True, slots=True)
class KeyedSchemas:
    """The output schemas of a keyed operator's tasks. Frozen: any thread."""

    #: the user's output rows (``StructType``)
    user: Any
    #: the tasks' rows: the user's columns (nullable), then the result columns
    mapped: Any
    #: ``mapped`` as an Arrow schema
    arrow: Any


def keyed_schemas(output_schema: Any, timezone: str | None = None) -> KeyedSchemas:
    """The schemas of a keyed operator whose rows are ``output_schema`` (DDL, ``StructType``, None).

    Timestamps in the Arrow schema carry ``timezone``, by default the active
    session's ``spark.sql.session.timeZone`` (as Spark's own Arrow schemas do).
    Called on the driver.
    """
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import BinaryType, StructField, StructType

    if isinstance(output_schema, str):
        output_schema = StructType.fromDDL(output_schema)
    user = output_schema or StructType([])
    # every field nullable: the result row of a task has nulls in the user columns
    mapped = StructType(
        [StructField(f.name, f.dataType, True) for f in user.fields]
        + [StructField(name, BinaryType(), True) for name in RESULT_COLUMNS]
    )
    zone = timezone or session_timezone()
    return KeyedSchemas(user=user, mapped=mapped, arrow=to_arrow_schema(mapped, timezone=zone))


def session_timezone() -> str:
    """The active Spark session's time zone (``spark.sql.session.timeZone``; UTC without one)."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    zone = session.conf.get("spark.sql.session.timeZone") if session is not None else None
    return zone or "UTC"


@dataclass(frozen=True, slots=True)
class BatchHooks:
    """What a kind of keyed operator adds to the batch cycle of :func:`run_keyed_query`.

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


def run_keyed_query(
    df: Any,
    *,
    key: str,
    schemas: KeyedSchemas,
    hooks: BatchHooks,
    sink: Callable[[Any, int], None] | None,
    opts: KeyedOptions,
    handle_factory: Callable[[CheckpointCoordinator, int | None], DstlQuery] = DstlQuery,
) -> DstlQuery:
    """The batch cycle of a keyed operator (see the module documentation), with ``hooks``.

    ``handle_factory(coordinator, metrics_port)`` makes the returned query
    handle (a :class:`DstlQuery` or a subclass).
    """
    from pyspark.sql import functions as F

    opts.validate()
    if key not in df.columns:
        raise ConfigError(f"key column {key!r} is not in {df.columns}")
    for reserved in RESERVED_COLUMNS:
        if reserved in df.columns:
            raise ConfigError(f"column name {reserved!r} is reserved")
    parallelism = opts.parallelism
    on_phase = opts.on_phase
    coordinator = CheckpointCoordinator(opts.coordinator_config())
    try:
        coordinator.start()
        if hooks.state_schemas is not None:  # before the first batch: a mismatch fails here
            coordinator.adopt_schemas(hooks.state_schemas, hooks.deleted_states)
    except BaseException:
        coordinator.close()  # its metadata store client and metrics server
        raise
    job_id = coordinator.config.job_id
    port = (
        coordinator.metrics.serve(opts.metrics_port, opts.metrics_host)
        if opts.metrics_port is not None
        else None
    )
    handle = handle_factory(coordinator, port)
    if opts.config_port is not None:
        handle.config_server = CheckpointConfigServer(
            opts.config_host, opts.config_port, token=opts.config_token
        )
        handle.config_server.register(coordinator)
    running: dict[int, tuple[Any, str]] = {}

    def abort(batch_id: int) -> None:
        found = running.get(batch_id)
        if found is not None:
            found[0].interruptTag(found[1])

    coordinator.on_timeout = abort
    coordinator.start_watchdog()
    spark_checkpoint = opts.spark_checkpoint_dir
    failures = CheckpointFailures(lambda: coordinator.config.tolerable_failed_checkpoints)
    handle.failures = failures

    def run_batch(batch_df: Any, batch_id: int) -> None:
        if handle.halted:
            raise QueryStopping(f"batch {batch_id} not run: the query is stopping")
        with handle.in_batch:
            if handle.halted:  # a trigger switch began while this batch waited
                raise QueryStopping(f"batch {batch_id} not run: the query is stopping")
            while True:  # again after a tolerated checkpoint failure (see .failures)
                started = time.monotonic()
                plan = coordinator.plan_batch(batch_id, parallelism)
                if plan is None:
                    return
                if on_phase is not None:
                    on_phase("planned", batch_id)
                session = batch_df.sparkSession
                tag = f"dstl-{job_id}-{batch_id}"
                session.addTag(tag)
                running[batch_id] = (session, tag)
                try:
                    _run_plan(batch_df, batch_id, plan, started)
                except Exception as exc:
                    aborted = coordinator.was_aborted(batch_id)
                    if handle.halted or not failures.retry(batch_id, exc, aborted=aborted):
                        raise
                    continue
                finally:
                    running.pop(batch_id, None)
                    session.removeTag(tag)
                    coordinator.end_batch(batch_id)
                failures.succeeded()
                return

    def _run_plan(batch_df: Any, batch_id: int, plan: BatchPlan, started: float) -> None:
        rows = batch_df if hooks.prepare is None else hooks.prepare(batch_df, batch_id, plan)
        task = hooks.make_task(plan, batch_df, batch_id)
        mapped = route_and_map(
            rows,
            key=key,
            parallelism=parallelism,
            max_parallelism=opts.max_parallelism,
            task=task,
            schemas=schemas,
        )
        is_result = F.col(META_COLUMN).isNotNull()
        if sink is None:
            metas = mapped.where(is_result).select(*RESULT_COLUMNS).collect()
        else:
            mapped = mapped.persist()
            try:
                metas = mapped.where(is_result).select(*RESULT_COLUMNS).collect()
                sink(mapped.where(~is_result).drop(*RESULT_COLUMNS), batch_id)
            finally:
                mapped.unpersist()
        results = [TaskResult.from_bytes(bytes(r[0])) for r in metas]
        if on_phase is not None:
            on_phase("tasks_done", batch_id)
        coordinator.complete_batch(
            plan,
            results,
            source_progress=source_progress(spark_checkpoint, batch_id),
            started_monotonic=started,
        )
        if on_phase is not None:
            on_phase("recorded", batch_id)
        if hooks.recorded is not None:
            hooks.recorded(batch_id, [None if r[1] is None else bytes(r[1]) for r in metas])

    if opts.start:
        handle.restart = functools.partial(start_query, df, run_batch, opts)
        coordinator.on_interval_change = handle.change_interval
        try:
            handle.query = start_query(
                df, run_batch, opts, coordinator.config.checkpoint_interval_s
            )
        except BaseException:
            with contextlib.suppress(Exception):
                coordinator.close()
            raise
    return handle


def start_query(
    df: Any, run_batch: Callable[[Any, int], None], opts: KeyedOptions, interval_s: float = 0.0
) -> Any:
    """Start ``df.writeStream.foreachBatch(run_batch)`` with the query options of ``opts``.

    ``interval_s`` > 0 (the effective checkpoint interval, e.g. a REST
    override) is the trigger; else ``opts.trigger``.
    """
    writer = df.writeStream.foreachBatch(run_batch).option(
        "checkpointLocation", str(opts.spark_checkpoint_dir)
    )
    trigger = trigger_of(interval_s, opts.trigger)
    if trigger:
        writer = writer.trigger(**trigger)
    if opts.query_name:
        writer = writer.queryName(opts.query_name)
    return writer.start()


def route_and_map(
    rows: Any,
    *,
    key: str,
    parallelism: int,
    max_parallelism: int,
    task: TaskFunction,
    schemas: KeyedSchemas,
) -> Any:
    """``rows`` (null keys dropped) routed to their subtasks, through ``task`` (``mapInArrow``).

    Each row goes to the subtask of its key group (Flink's operator index,
    computed by Spark: :func:`~dstl_client.keygroups.partition_sql`); one
    marker row per subtask makes every subtask run, with data or without.
    The result has ``schemas.mapped``: the user's output rows, then one
    result row per task.
    """
    from pyspark.sql import functions as F

    part_expr = partition_sql(key, parallelism, max_parallelism)
    markers = rows.sparkSession.range(parallelism).select(
        F.col("id").cast("int").alias(PART_COLUMN), F.lit(True).alias(MARKER_COLUMN)
    )
    routed = (
        rows.where(F.col(key).isNotNull())
        .withColumn(PART_COLUMN, F.expr(part_expr))
        .withColumn(MARKER_COLUMN, F.lit(False))
        .unionByName(markers, allowMissingColumns=True)
        .repartitionById(parallelism, F.col(PART_COLUMN))
        .drop(PART_COLUMN)
    )
    return routed.mapInArrow(task, schemas.mapped)
