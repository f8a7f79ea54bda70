"""A task whose changelog writer fails: the task fails, its retry starts a new log.

The sidecar takes requests of at most 1 MiB while the client may send up to
64 MiB (a configuration mismatch): a first attempt whose changes do not fit
into one request has its ``Append`` (or its persist carrying them) refused by
gRPC before the sidecar sees it. That attempt must fail, and the retried
attempt must neither reuse the failed writer's log nor apply anything twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dstl_client.batch.local import partition_rows
from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.client import ChangelogClient
from dstl_client.core.errors import DstlError, WriterFailed
from dstl_client.keygroups import key_group_range_for_operator
from dstl_client.state.api import KeyedContext
from dstl_client.state.serializers import STR
from dstl_client.state.store import LocalKeyedStore
from dstl_client.state.store_dirs import store_dir
from dstl_client.state.subtask import run_keyed
from dstl_server.testing import ServerProcess
from tests.dstl_client.state._jobs import (
    MAX_P,
    final_state,
    job_fn,
    make_batches,
    make_coordinator,
    reference,
    runner,
)

KiB = 1 << 10
MiB = 1 << 20
BIG = 300 * KiB


def log_id_of(plan: BatchPlan, index: int) -> str:
    rng = key_group_range_for_operator(index, plan.parallelism, MAX_P)
    with LocalKeyedStore(store_dir(plan.state_dir, plan.job_id, plan.operator_id, rng), rng) as s:
        return s.meta("log_id")


def oversized(n_big: int, swallow: bool) -> Any:
    """``job_fn`` plus a 300 KiB value for the first ``n_big`` keys.

    With ``swallow``, state errors are caught and ignored (a careless user
    function): the writer's failure must still fail the task.
    """
    seen = 0

    def fn(key: Any, rows: list[dict[str, Any]], ctx: KeyedContext) -> list[Any]:
        nonlocal seen
        out: list[Any] = []
        try:
            out = list(job_fn(key, rows, ctx))
            if seen < n_big:
                seen += 1
                ctx.value_state("blob", STR).update("x" * BIG)
        except DstlError:
            if not swallow:
                raise
        return out

    return fn


@pytest.mark.slow
@pytest.mark.parametrize(
    ("batch_bytes", "n_big", "swallow", "error"),
    [
        # the client's batch (4 x 300 KiB >= 1 MiB) goes out as an Append, refused
        pytest.param(MiB, 4, False, DstlError, id="append"),
        # the 1.2 MiB stay buffered and ride on the persist, which is refused
        pytest.param(2 * MiB, 4, False, DstlError, id="persist"),
        # more than 4096 changes: sent while the function runs, which swallows
        # the error; the persist at the end raises WriterFailed
        pytest.param(MiB, 4, True, WriterFailed, id="swallowed"),
    ],
)
def test_a_failed_send_fails_the_task_and_the_retry_starts_a_new_log(
    tmp_path: Path, batch_bytes: int, n_big: int, swallow: bool, error: type[DstlError]
) -> None:
    batches = make_batches(3, rows=300, keys=60)
    if swallow:  # enough changes that the state backend hands them over mid-task
        batches[1] = batches[1] * 8
    limits = ["--max-request-bytes", str(MiB), "--max-change-bytes", str(512 * KiB)]
    with (
        ServerProcess(tmp_path / "sidecar", extra_args=limits) as proc,
        ChangelogClient(proc.address, batch_bytes=batch_bytes) as client,
    ):
        coord = make_coordinator(tmp_path, proc.address, job_id="wf", client=client)
        run = runner(coord, 2, client)
        assert run.run_batch(0, batches[0]) is not None
        plan = coord.plan_batch(1, 2)
        assert plan is not None
        old_log = log_id_of(plan, 0)

        groups = partition_rows(batches[1], lambda r: r["k"], 2, MAX_P)
        with pytest.raises(error):
            run_keyed(plan, 0, groups[0].items(), oversized(n_big, swallow), client=client)

        # Spark runs the task again: a new log, state from the last checkpoint
        _, results = run.run_tasks(plan, batches[1])
        assert results[0].stats.new_writer, "the retry reused the failed writer's log"
        assert log_id_of(plan, 0) != old_log
        assert not results[1].stats.new_writer
        coord.complete_batch(plan, results)
        assert run.run_batch(2, batches[2]) is not None
        assert final_state(coord, client) == reference(batches)
        # the failed log was closed: one writer per subtask is left
        assert proc.scrape_metrics()["dstl_writers"] == 2
        coord.close()
