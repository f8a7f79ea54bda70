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
   partition: ``fn(key, rows, ctx)`` per key, state changes applied to the
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

Requirements: PySpark >= 4.1 (``repartitionById``), pyarrow, this package
installed on the executors, ``PYSPARK_PYTHON`` pointing at that Python.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dstl_client.coordinator.coordinator import (
    CheckpointCoordinator,
    CoordinatorConfig,
    ObjectLister,
    blob_store_lister,
)
from dstl_client.coordinator.records import TaskResult
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.core.errors import ConfigError, DstlError
from dstl_client.keygroups import DEFAULT_MAX_PARALLELISM, check_parallelism, partition_sql
from dstl_client.state.subtask import BatchPlan, KeyedFunction, run_keyed

log = logging.getLogger(__name__)

META_COLUMN = "__dstl_meta"
PART_COLUMN = "__dstl_part"
MARKER_COLUMN = "__dstl_marker"
#: output rows per Arrow batch returned by a task
_OUT_BATCH_ROWS = 10_000


def default_job_id(checkpoint_dir: str) -> str:
    """A job id derived from the checkpoint directory (stable across restarts)."""
    path = str(Path(checkpoint_dir).resolve())
    base = re.sub(r"[^A-Za-z0-9._-]", "-", Path(path).name).strip("-.") or "job"
    return f"{base[:100]}-{zlib.crc32(path.encode()):08x}"


def _task(
    plan: BatchPlan,
    key: str,
    fn: KeyedFunction,
    columns: list[str],
    out_schema: Any,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """One partition of one batch on an executor (the ``mapInArrow`` function)."""
    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - always set inside a task
        raise RuntimeError("not inside a Spark task")
    index = ctx.partitionId()
    groups: dict[Any, list[dict[str, Any]]] = {}
    for rb in batches:
        if rb.num_rows == 0:
            continue
        marker = rb.column(MARKER_COLUMN).to_pylist()
        data = rb.select(columns).to_pylist()
        for is_marker, row in zip(marker, data, strict=True):
            if is_marker:
                continue
            k = row[key]
            rows = groups.get(k)
            if rows is None:
                groups[k] = [row]
            else:
                rows.append(row)
    outputs: list[Any] = []
    user_fields = [f for f in out_schema if f.name != META_COLUMN]
    # without an output schema the function's rows have nowhere to go
    emit = outputs.append if user_fields else None
    result = run_keyed(plan, index, groups.items(), fn, emit=emit)
    result.stats["task_attempt"] = ctx.attemptNumber()
    fault = plan.extra.get("fail_after_commit")
    if fault is not None and tuple(fault) == (plan.batch_id, index) and ctx.attemptNumber() == 0:
        # fault injection for tests: the batch is persisted and committed locally,
        # then the attempt dies; Spark's retry must not apply it twice
        raise RuntimeError(f"injected failure after commit: batch {plan.batch_id} task {index}")
    names = [f.name for f in user_fields]
    for start in range(0, len(outputs), _OUT_BATCH_ROWS):
        chunk = outputs[start : start + _OUT_BATCH_ROWS]
        if isinstance(chunk[0], dict):
            cols = [[row.get(n) for row in chunk] for n in names]
        else:
            cols = [list(c) for c in zip(*chunk, strict=True)]
        arrays = [pa.array(c, type=f.type) for c, f in zip(cols, user_fields, strict=True)]
        arrays.append(pa.nulls(len(chunk), type=pa.binary()))
        yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)
    meta = [pa.nulls(1, type=f.type) for f in user_fields]
    meta.append(pa.array([result.to_bytes()], type=pa.binary()))
    yield pa.RecordBatch.from_arrays(meta, schema=out_schema)


class QueryStopping(DstlError):
    """Raised into Spark for a batch that starts while :meth:`DstlQuery.stop` runs."""

    kind = "query_stopping"


class DstlQuery:
    """A running keyed query: the Spark query, its coordinator and statistics."""

    def __init__(self, coordinator: CheckpointCoordinator, metrics_port: int | None) -> None:
        self.coordinator = coordinator
        self.metrics_port = metrics_port
        self.query: Any = None
        self._in_batch = threading.Lock()
        self._stopping = False
        self.config_server: CheckpointConfigServer | None = None

    @property
    def history(self) -> list[dict[str, Any]]:
        """Per-checkpoint statistics (see :meth:`CheckpointCoordinator.complete_batch`)."""
        return list(self.coordinator.history)

    @property
    def last_batch_id(self) -> int:
        latest = self.coordinator.latest
        return -1 if latest is None else latest.batch_id

    def wait_for_batch(self, batch_id: int, timeout_s: float = 300.0) -> None:
        """Block until the checkpoint of ``batch_id`` (or a later one) is recorded."""
        deadline = time.monotonic() + timeout_s
        while self.last_batch_id < batch_id:
            if self.query is not None and not self.query.isActive:
                exc = self.query.exception()
                raise RuntimeError(f"the query stopped: {exc}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} not checkpointed in {timeout_s}s")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop the query between two batches, then release the coordinator.

        A running batch is let finish (up to ``timeout_s``); a batch that
        starts after this call does nothing and fails the query with
        :class:`QueryStopping`, so it is not committed and runs again on the
        next start (stopping Spark in the middle of a batch is noisy).
        """
        self._stopping = True
        if self.query is not None:
            if self._in_batch.acquire(timeout=timeout_s):
                self._in_batch.release()
            self.query.stop()
        if self.config_server is not None:
            self.config_server.close()
            self.config_server = None
        self.coordinator.close()

    def await_termination(self, timeout_s: float | None = None) -> bool | None:
        if self.query is None:
            return True
        return self.query.awaitTermination(None if timeout_s is None else int(timeout_s))  # type: ignore[no-any-return]


def _source_progress(spark_checkpoint: Path, batch_id: int) -> Any:
    """Spark's offsets log entry of the batch (what input the checkpoint covers)."""
    path = spark_checkpoint / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    out: list[Any] = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out


def process_keyed(
    df: Any,
    *,
    key: str,
    fn: KeyedFunction,
    parallelism: int,
    checkpoint_dir: str,
    output_schema: Any = None,
    sink: Callable[[Any, int], None] | None = None,
    job_id: str | None = None,
    operator_id: str = "keyed",
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    dstl_address: str | None = None,
    dstl_token: str | None = None,
    state_dir: str | None = None,
    storage_url: str | None = None,
    lister: ObjectLister | None = None,
    materialize_interval_s: float = 30.0,
    retain: int = 2,
    max_materialization_failures: int = 3,
    full_snapshot: bool = False,
    trigger: dict[str, Any] | None = None,
    metrics_port: int | None = None,
    query_name: str | None = None,
    start: bool = True,
    checkpoint_timeout_s: float = 600.0,
    config_port: int | None = None,
    on_phase: Callable[[str, int], None] | None = None,
    _task_faults: dict[str, Any] | None = None,
) -> DstlQuery:
    """Run ``fn(key, rows, ctx)`` per key and micro-batch, with keyed state on the DSTL.

    ``df`` is a streaming DataFrame with a string or integer column ``key``
    (rows with a null key are dropped). ``fn`` gets the key, that key's rows
    of the batch (dicts of the input columns, in arrival order) and a
    :class:`~dstl_client.state.KeyedContext`; it yields output rows (tuples or
    dicts) of ``output_schema`` (a ``StructType`` or DDL string), which go to
    ``sink(out_df, batch_id)`` once per batch.

    ``checkpoint_dir`` holds Spark's checkpoint (``spark/``) and the
    checkpoint records (``dstl/``). ``max_parallelism`` (the number of key
    groups) is fixed for the job's life; ``parallelism`` may change between
    runs. ``storage_url`` (the sidecar's ``file://`` or ``s3://`` store) lets
    the driver list the job's objects to remove orphans of a crash on start.
    Progress is logged and exposed as Prometheus metrics on ``metrics_port``.
    A batch whose checkpoint takes longer than ``checkpoint_timeout_s`` is
    aborted (its Spark jobs interrupted; the query fails and re-runs it on
    restart). ``config_port`` serves the dynamic configuration REST endpoint
    (:mod:`dstl_client.coordinator.rest`) to change timeout and
    materialization interval while the query runs.
    ``on_phase(phase, batch_id)`` is called on the driver at ``"planned"``
    (before the tasks), ``"tasks_done"`` (results collected, sink called, no
    record yet) and ``"recorded"`` (record written, Spark not told yet).

    Returns a :class:`DstlQuery` (started unless ``start=False``).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import BinaryType, StructField, StructType

    check_parallelism(parallelism, max_parallelism)
    if key not in df.columns:
        raise ConfigError(f"key column {key!r} is not in {df.columns}")
    for reserved in (META_COLUMN, PART_COLUMN, MARKER_COLUMN):
        if reserved in df.columns:
            raise ConfigError(f"column name {reserved!r} is reserved")
    if isinstance(output_schema, str):
        output_schema = StructType.fromDDL(output_schema)
    user_schema = output_schema or StructType([])
    # every field nullable: the result row of a task has nulls in the user columns
    mapped_schema = StructType(
        [StructField(f.name, f.dataType, True) for f in user_schema.fields]
        + [StructField(META_COLUMN, BinaryType(), True)]
    )
    arrow_schema = to_arrow_schema(mapped_schema)
    columns = list(df.columns)
    lister = lister or (blob_store_lister(storage_url) if storage_url else None)
    config = CoordinatorConfig(
        job_id=job_id or default_job_id(checkpoint_dir),
        checkpoint_dir=checkpoint_dir,
        operator_id=operator_id,
        max_parallelism=max_parallelism,
        retain=retain,
        materialize_interval_s=materialize_interval_s,
        max_materialization_failures=max_materialization_failures,
        full_snapshot=full_snapshot,
        state_dir=state_dir or "",
        dstl_address=dstl_address or "",
        dstl_token=dstl_token,
        checkpoint_timeout_s=checkpoint_timeout_s,
    )
    coordinator = CheckpointCoordinator(config, lister=lister)
    coordinator.start()
    port = coordinator.metrics.serve(metrics_port) if metrics_port is not None else None
    handle = DstlQuery(coordinator, port)
    if config_port is not None:
        handle.config_server = CheckpointConfigServer(port=config_port)
        handle.config_server.register(coordinator)
    running: dict[int, tuple[Any, str]] = {}

    def abort(batch_id: int) -> None:
        found = running.get(batch_id)
        if found is not None:
            found[0].interruptTag(found[1])

    coordinator.on_timeout = abort
    coordinator.start_watchdog()
    spark_checkpoint = Path(checkpoint_dir) / "spark"
    # Flink's operator index of the key group, computed by Spark
    part_expr = partition_sql(key, parallelism, max_parallelism)

    def run_batch(batch_df: Any, batch_id: int) -> None:
        if handle._stopping:
            raise QueryStopping(f"batch {batch_id} not run: the query is stopping")
        with handle._in_batch:
            started = time.monotonic()
            plan = coordinator.plan_batch(batch_id, parallelism)
            if plan is None:
                return
            if _task_faults:
                plan = dataclasses.replace(plan, extra={**plan.extra, **_task_faults})
            if on_phase is not None:
                on_phase("planned", batch_id)
            session = batch_df.sparkSession
            tag = f"dstl-{config.job_id}-{batch_id}"
            session.addTag(tag)
            running[batch_id] = (session, tag)
            try:
                _run_plan(batch_df, batch_id, plan, started)
            finally:
                running.pop(batch_id, None)
                session.removeTag(tag)
                coordinator.end_batch(batch_id)

    def _run_plan(batch_df: Any, batch_id: int, plan: BatchPlan, started: float) -> None:
        markers = batch_df.sparkSession.range(parallelism).select(
            F.col("id").cast("int").alias(PART_COLUMN), F.lit(True).alias(MARKER_COLUMN)
        )
        routed = (
            batch_df.where(F.col(key).isNotNull())
            .withColumn(PART_COLUMN, F.expr(part_expr))
            .withColumn(MARKER_COLUMN, F.lit(False))
            .unionByName(markers, allowMissingColumns=True)
            .repartitionById(parallelism, F.col(PART_COLUMN))
            .drop(PART_COLUMN)
        )
        task = functools.partial(_task, plan, key, fn, columns, arrow_schema)
        mapped = routed.mapInArrow(task, mapped_schema)
        if sink is None:
            metas = mapped.where(F.col(META_COLUMN).isNotNull()).select(META_COLUMN).collect()
        else:
            mapped = mapped.persist()
            try:
                metas = mapped.where(F.col(META_COLUMN).isNotNull()).select(META_COLUMN).collect()
                sink(mapped.where(F.col(META_COLUMN).isNull()).drop(META_COLUMN), batch_id)
            finally:
                mapped.unpersist()
        results = [TaskResult.from_bytes(bytes(r[0])) for r in metas]
        if on_phase is not None:
            on_phase("tasks_done", batch_id)
        coordinator.complete_batch(
            plan,
            results,
            source_progress=_source_progress(spark_checkpoint, batch_id),
            started_monotonic=started,
        )
        if on_phase is not None:
            on_phase("recorded", batch_id)

    if start:
        writer = df.writeStream.foreachBatch(run_batch).option(
            "checkpointLocation", str(spark_checkpoint)
        )
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        try:
            handle.query = writer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                coordinator.close()
            raise
    return handle
