"""One subtask of one batch of a vectorized query: one call of the user's function.

Engine-neutral (Spark's side is :mod:`.task`; tests drive it directly):

1. open the :class:`~dstl_client.state.subtask.Subtask` (the store at the
   last checkpoint, the changelog writer), as every task kind;
2. find the due timers (:mod:`.timers`), read the state of the keys of the
   rows and of the timers in bulk (:func:`dstl_client.state.bulk.read_rows`);
3. call ``fn`` once with a :class:`~.api.BatchInput`;
4. check what it returned (:mod:`.frames`) and apply its upserts, deletes,
   timers and the TTL index changes in bulk (:mod:`.apply`), then the TTL
   cleanup pass;
5. persist and commit (:meth:`Subtask.finish`): the output rows may leave
   the task only after this returns.

Thread: the task's thread (one call per task attempt).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.client import ChangelogClient
from dstl_client.core.errors import InvalidArgument
from dstl_client.processor.stats import ProcessorStats
from dstl_client.processor.times import BatchTimes
from dstl_client.state.bulk import read_rows
from dstl_client.state.subtask import Subtask
from dstl_client.vectorized.api import BatchFunction, BatchInput, BatchOutput
from dstl_client.vectorized.apply import apply_changes
from dstl_client.vectorized.frames import table_of, to_frame
from dstl_client.vectorized.keys import (
    KG_COLUMN,
    TIMER_INDEX_PREFIX,
    key_bytes_of,
    keys_from_bytes,
    state_row_keys,
)
from dstl_client.vectorized.spec import VectorSpec
from dstl_client.vectorized.timers import INDEX_ROWS, due_rows
from dstl_client.vectorized.updates import StateUpdate
from dstl_client.vectorized.values import ValueCodec


@dataclass(frozen=True, slots=True)
class VectorRun:
    """What one task of one batch produced. Frozen."""

    result: TaskResult
    stats: ProcessorStats
    #: the output rows (``spec.output_schema``)
    output: pa.Table


def run_batch(
    plan: BatchPlan,
    index: int,
    spec: VectorSpec,
    fn: BatchFunction,
    rows: pa.Table | None,
    times: BatchTimes,
    *,
    client: ChangelogClient | None = None,
) -> VectorRun:
    """Run subtask ``index`` of ``plan``: ``fn`` once over ``rows`` (the input columns and
    :data:`~.keys.KG_COLUMN`; ``None``: no rows). Returns once the batch's changes are
    durable and committed locally."""
    t0 = time.perf_counter()
    codec = ValueCodec(spec.state_schema)
    if rows is None:
        rows = pa.table(
            {
                **{f.name: pa.array([], f.type) for f in spec.input_schema},
                KG_COLUMN: pa.array([], pa.int32()),
            }
        )
    now = times.processing_ms
    due_at = times.timers_due_at(spec.time_mode)
    with Subtask(plan, index, client) as task:
        task.open()
        store = task.store
        t1 = time.perf_counter()
        kb_rows = key_bytes_of(rows.column(spec.key))
        keys = pc.unique(kb_rows)
        kgs = rows.column(KG_COLUMN).combine_chunks().cast(pa.int32())
        key_kgs = kgs.take(pc.index_in(keys, value_set=kb_rows))
        due = (
            due_rows(store, TIMER_INDEX_PREFIX, due_at)
            if due_at is not None
            else INDEX_ROWS.empty_table()
        )
        # the keys of the state table: the rows' keys, then the timers' other keys
        due_kb = due.column("kb").combine_chunks()
        other = pc.invert(pc.is_in(due_kb, value_set=keys))
        extra = pa.table({"kb": due_kb, "kg": due.column("kg")}).filter(other)
        extra_first = pc.index_in(pc.unique(extra.column("kb")), value_set=extra.column("kb"))
        extra = extra.take(extra_first)
        known_kb = pa.concat_arrays([keys, extra.column("kb").combine_chunks()])
        known_kg = pa.concat_arrays([key_kgs, extra.column("kg").combine_chunks()])
        stored = read_rows(store, pa.table({"kg": known_kg, "k": state_row_keys(known_kb)}))
        columns, present, expiry = codec.decode(stored.column("v").combine_chunks())
        if spec.ttl_ms is not None:
            present = present & (expiry > now)
            mask = pa.array(present, pa.bool_())
            columns = [pc.if_else(mask, c, pa.scalar(None, c.type)) for c in columns]
        key_type = spec.key_field.type
        state = pa.Table.from_arrays(
            [keys_from_bytes(known_kb, key_type), *columns, pa.array(present, pa.bool_())],
            schema=pa.schema(spec.state_fields),
        )
        expired = pa.Table.from_arrays(
            [keys_from_bytes(due_kb, key_type), due.column("ms")],
            schema=pa.schema(spec.timer_fields),
        )
        user_rows = rows.select([f.name for f in spec.input_schema])
        out = fn(
            BatchInput(
                rows=to_frame(user_rows, spec.frame),
                state=to_frame(state, spec.frame),
                expired=to_frame(expired, spec.frame),
                batch_id=plan.batch_id,
                watermark_ms=None if spec.event_time_column is None else times.watermark_ms,
                processing_time_ms=now,
            )
        )
        if out is None:
            out = BatchOutput()
        if not isinstance(out, BatchOutput):
            raise InvalidArgument(
                f"the function returned a {type(out).__name__}, not a BatchOutput"
            )
        output = table_of(out.output, "output", list(spec.output_schema))
        update = StateUpdate(spec, codec, store, known_kb, known_kg, now, plan.max_parallelism)
        apply_changes(task.backend, update.changes(out, due))
        evicted = 0
        if spec.ttl_ms is not None and now >= 0:
            cleanup, evicted = update.ttl_cleanup()
            apply_changes(task.backend, cleanup)
        t2 = time.perf_counter()
        task.stats = replace(
            task.stats,
            rows=rows.num_rows,
            keys=len(keys),
            open_s=round(t1 - t0, 4),
            apply_s=round(t2 - t1, 4),
        )
        result = task.finish()
    if output is None:
        output = spec.output_schema.empty_table()
    stats = ProcessorStats(
        input_rows=rows.num_rows,
        keys=len(keys),
        timers_fired=due.num_rows,
        ttl_evicted=evicted,
        output_rows=output.num_rows,
        state_rows=-1,
    )
    result = replace(result, stats=replace(result.stats, task_s=round(time.perf_counter() - t0, 4)))
    return VectorRun(result=result, stats=stats, output=output)
