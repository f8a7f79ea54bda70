"""Run a keyed operator in this process, batch by batch, without Spark.

The same plan/task/record cycle as the Spark integration, with the tasks run
one after the other here: for tests, tools, and reading a checkpoint's state.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.keygroups import KeyGroupRange, key_group_for_key
from dstl_client.state.restore import restore_range
from dstl_client.state.store import LocalKeyedStore, read_all_rows
from dstl_client.state.subtask import KeyedFunction, run_keyed


def partition_rows(
    rows: Iterable[Any], key: Callable[[Any], object], parallelism: int, max_parallelism: int
) -> list[dict[object, list[Any]]]:
    """Rows grouped per subtask, then per key (in first-seen order)."""
    parts: list[dict[object, list[Any]]] = [defaultdict(list) for _ in range(parallelism)]
    for row in rows:
        k = key(row)
        kg = key_group_for_key(k, max_parallelism)
        parts[kg * parallelism // max_parallelism][k].append(row)
    return parts


class LocalRunner:
    """Drives one :class:`CheckpointCoordinator` and runs its tasks in-process.

    Thread: the caller's (one batch at a time, like a ``foreachBatch`` thread).
    """

    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        fn: KeyedFunction,
        key: Callable[[Any], object],
        parallelism: int,
        client: ChangelogClient | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.fn = fn
        self.key = key
        self.parallelism = parallelism
        self.client = client or coordinator.client

    def run_tasks(self, plan: BatchPlan, rows: Iterable[Any]) -> tuple[list[Any], list[TaskResult]]:
        """Every subtask of ``plan`` over ``rows``: outputs and results (nothing recorded)."""
        outputs: list[Any] = []
        results = []
        groups = partition_rows(rows, self.key, plan.parallelism, plan.max_parallelism)
        for i, by_key in enumerate(groups):
            results.append(
                run_keyed(plan, i, by_key.items(), self.fn, emit=outputs.append, client=self.client)
            )
        return outputs, results

    def run_batch(
        self, batch_id: int, rows: Iterable[Any], source_progress: Any = None
    ) -> list[Any] | None:
        """Plan, run and checkpoint one batch; ``None`` if it was already checkpointed."""
        plan = self.coordinator.plan_batch(batch_id, self.parallelism)
        if plan is None:
            return None
        outputs, results = self.run_tasks(plan, rows)
        self.coordinator.complete_batch(plan, results, source_progress=source_progress)
        return outputs


def checkpoint_rows(
    record: CheckpointRecord, client: ChangelogClient, workdir: str | None = None
) -> dict[tuple[int, bytes], bytes]:
    """The whole state of a checkpoint, ``{(key group, row key): value}``.

    Restores every key group into a scratch store (the same code path as a
    task's recovery) and reads it back.
    """
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        rng = KeyGroupRange(0, record.max_parallelism - 1)
        with LocalKeyedStore(tmp, rng) as store:
            restore_range(store, record, client)
            return read_all_rows(store)
