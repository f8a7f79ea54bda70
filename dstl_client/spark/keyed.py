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

Each micro-batch runs on the batch cycle (:class:`~dstl_client.batch.cycle.BatchCycle`,
``foreachBatch``): planned by the driver's checkpoint coordinator, rows routed
by key group to one subtask per partition (:func:`~.task.keyed_task`:
``fn(key, rows, ctx)`` per key, state changes persisted to the DSTL before
the task ends), output rows to ``sink``, then the checkpoint record; only
then does Spark commit the batch. A restarted query re-runs its uncommitted
batch with the same id and input, from the last record, so the state is
exactly-once. ``sink`` must tolerate a batch delivered again after a crash
(as with any ``foreachBatch`` sink: use the batch id).

How the query runs is one frozen :class:`~dstl_client.batch.options.KeyedOptions`
(``config=``); keyword arguments map onto its fields, so
``process_keyed(df, key="k", fn=f, parallelism=2, checkpoint_dir=...)`` works.

Requirements: PySpark >= 4.1 (``repartitionById``), pyarrow, this package
installed on the executors, ``PYSPARK_PYTHON`` pointing at that Python.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dstl_client.batch.cycle import BatchHooks, run_keyed_query
from dstl_client.batch.options import KeyedOptions
from dstl_client.batch.query import DstlQuery
from dstl_client.batch.routing import TaskFunction, keyed_schemas
from dstl_client.bounded.dataframe import process_bounded, sorted_mode
from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.extras import require_spark
from dstl_client.spark.task import keyed_task
from dstl_client.state.subtask import KeyedFunction


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

    How it runs is ``config`` (a :class:`~dstl_client.batch.options.KeyedOptions`) with the
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
        df,
        key=key,
        schemas=schemas,
        hooks=BatchHooks(make_task=make_task),
        sink=sink,
        opts=opts,
        handle_factory=DstlQuery,
    )
