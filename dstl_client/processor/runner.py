"""One subtask of one batch of a processor: the ``StatefulProcessor`` lifecycle over a ``Subtask``.

Engine-neutral (Spark's side is :mod:`.task`; tests drive it directly):

1. open the :class:`~dstl_client.state.subtask.Subtask` (the store at the
   last checkpoint, the changelog writer);
2. ``init(handle)``;
3. ``handleInitialState`` for the initial state given (the first batch);
4. ``handleInputRows`` once per key with input, in the order given;
5. ``handleExpiredTimer`` for every due timer of the subtask's key groups, in
   timestamp order (:meth:`~.runtime.ProcessorRuntime.fire_timers`);
6. the TTL cleanup pass; ``close()``;
7. persist and commit (:meth:`Subtask.finish`): outputs the caller got through
   ``emit`` may leave the task only after this returns.

Thread: the task's thread (one call per task attempt).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.client import ChangelogClient
from dstl_client.processor.runtime import Emit, ProcessorRuntime, drain
from dstl_client.processor.stats import ProcessorStats
from dstl_client.processor.times import BatchTimes
from dstl_client.state.subtask import Subtask


def string_key(data: bytes) -> str:
    """A string grouping key from its stored bytes."""
    return data.decode("utf-8")


def integer_key(data: bytes) -> int:
    """An integer grouping key from its stored bytes (its decimal digits)."""
    return int(data)


#: grouping keys from their bytes, by kind of key column
KEY_DECODERS: dict[str, Callable[[bytes], Any]] = {"string": string_key, "integer": integer_key}


@dataclass(frozen=True, slots=True)
class ProcessorTask:
    """How a task runs the processor (the same for every task of a query). Frozen: any thread."""

    #: ``"None"``, ``"ProcessingTime"`` or ``"EventTime"``
    time_mode: str
    #: the grouping key from its stored bytes (for timers of keys without input)
    key_of: Callable[[bytes], Any]
    #: count the state rows after each batch (a scan of the store)
    count_state_rows: bool = True


def run_processor(
    plan: BatchPlan,
    index: int,
    processor: Any,
    groups: Iterable[tuple[Any, Any]],
    *,
    how: ProcessorTask,
    times: BatchTimes,
    emit: Emit | None = None,
    initial: Iterable[tuple[Any, Iterable[Any]]] = (),
    input_rows: int = 0,
    client: ChangelogClient | None = None,
) -> tuple[TaskResult, ProcessorStats]:
    """Run subtask ``index`` of ``plan``: ``groups`` is ``(key, rows)`` per key with input,
    ``rows`` what ``handleInputRows`` gets (an iterator of DataFrames or Rows);
    ``initial`` is ``(key, items)``, each item passed to ``handleInitialState``.

    Returns the task's checkpoint result and its figures once the batch's
    state changes are durable and committed locally.
    """
    t0 = time.perf_counter()
    with Subtask(plan, index, client) as task:
        task.open()
        runtime = ProcessorRuntime(
            task.backend, time_mode=how.time_mode, times=times, key_of=how.key_of
        )
        t1 = time.perf_counter()
        processor.init(runtime.handle)
        values = runtime.timer_values
        initial_rows = 0
        for key, items in initial:
            grouping = runtime.enter_key(key)
            for item in items:
                initial_rows += 1
                processor.handleInitialState(grouping, item, values)
        keys = 0
        for key, rows in groups:
            grouping = runtime.enter_key(key)
            keys += 1
            drain(processor.handleInputRows(grouping, rows, values), emit)
        runtime.leave_key()
        fired = runtime.fire_timers(processor, emit)
        evicted = runtime.evict_expired()
        processor.close()
        t2 = time.perf_counter()
        task.stats = replace(
            task.stats,
            rows=input_rows,
            keys=keys,
            open_s=round(t1 - t0, 4),
            apply_s=round(t2 - t1, 4),
        )
        result = task.finish()
        state_rows = task.store.count_live_rows() if how.count_state_rows else -1
    stats = ProcessorStats(
        input_rows=input_rows,
        initial_state_rows=initial_rows,
        keys=keys,
        timers_fired=fired,
        ttl_evicted=evicted,
        state_rows=state_rows,
    )
    result = replace(result, stats=replace(result.stats, task_s=round(time.perf_counter() - t0, 4)))
    return result, stats
