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

The batches run on the batch cycle (:class:`~dstl_client.batch.cycle.BatchCycle`,
N stages), with its tolerated checkpoint failures. Threads: the driver's
``foreachBatch`` thread runs batches one at a time;
:meth:`~dstl_client.batch.query.ChainQuery.stop` runs on the user's thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dstl_client.batch.cycle import BatchHooks, BatchStage, run_chain
from dstl_client.batch.options import KeyedOptions, stage_options
from dstl_client.batch.query import ChainQuery
from dstl_client.batch.routing import KeyedSchemas, TaskFunction, keyed_schemas
from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.core.errors import ConfigError
from dstl_client.extras import require_spark
from dstl_client.spark.task import keyed_task
from dstl_client.state.subtask import KeyedFunction


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
    links: list[BatchStage] = []
    for stage in stages:
        if stage.key not in columns:
            raise ConfigError(
                f"stage {stage.operator_id!r}: key column {stage.key!r} is not in {columns}"
            )
        schemas = keyed_schemas(stage.output_schema)
        links.append(
            BatchStage(
                opts=stage_options(opts, stage.operator_id, stage.parallelism),
                key=stage.key,
                schemas=schemas,
                hooks=BatchHooks(make_task=functools.partial(_keyed_task_of, stage, schemas)),
            )
        )
        columns = [f.name for f in schemas.user.fields]
    return run_chain(df, links, sink=sink, opts=opts, handle_factory=ChainQuery)


def _keyed_task_of(
    stage: KeyedStage, schemas: KeyedSchemas, plan: BatchPlan, rows: Any, batch_id: int
) -> TaskFunction:
    """A :class:`KeyedStage`'s ``mapInArrow`` function of a batch (its input: ``rows``)."""
    return functools.partial(
        keyed_task, plan, stage.key, stage.fn, list(rows.columns), schemas.arrow
    )
