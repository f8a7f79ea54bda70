"""Restoring a chosen checkpoint of a real PySpark job: roll back, fix, go on.

A file-source job (one file per micro-batch) runs to batch 5; it is then
started with ``restore_from=3`` and a fixed function (a roll back after a
bad deployment), and later rolled back again with ``dstl checkpoints
restore 4`` on the stopped job. Each time the results (final state and
every batch's output) equal a run that stopped at the restored batch and
went on from there: Spark re-planned the next batch from the restored
batch's end offsets (the same file), and the records of the later batches
were kept aside until the new run recorded those batches again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dstl_client.batch.local import checkpoint_rows
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.storage import CheckpointStorage
from dstl_client.ops.cli import main
from dstl_server.testing import ServerProcess
from tests.e2e._spark_job import (
    AGG,
    agg,
    agg_job_in,
    batch_rows,
    decode_state,
    read_outputs,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS, KEYS = 300, 60


def fixed(key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
    """The "fixed deployment": counts and sums ``2 * v``."""
    state = ctx.value_state("agg", AGG)
    count, total = state.value() or (0, 0)
    for r in rows:
        count += 1
        total += 2 * r["v"]
    state.update((count, total))
    yield key, count, total


def expected(
    functions: list[int],
) -> tuple[dict[str, tuple[int, int]], set[tuple[int, str, int, int]]]:
    """State and outputs when batch ``b`` ran with a factor ``functions[b]`` on ``v``."""
    state: dict[str, tuple[int, int]] = {}
    outputs: set[tuple[int, str, int, int]] = set()
    for b, factor in enumerate(functions):
        touched = set()
        for k, v in batch_rows(b, ROWS, KEYS):
            c, t = state.get(k, (0, 0))
            state[k] = (c + 1, t + factor * v)
            touched.add(k)
        outputs |= {(b, k, *state[k]) for k in touched}
    return state, outputs


def run(spark: Any, tmp: Path, sidecar: ServerProcess, fn: Any, until: int, **kw: Any) -> None:
    q = agg_job_in(
        spark,
        tmp,
        sidecar.address,
        fn=fn,
        job_id="e2e-restore",
        retain=3,
        materialize_interval_s=0,
        **kw,
    )
    try:
        q.wait_for_batch(until, timeout_s=180)
    finally:
        q.stop()


def records(tmp: Path, prefix: str = "checkpoints/") -> CheckpointStorage:
    return CheckpointStorage(tmp / "ckpt" / "dstl" / prefix)


def state_of(tmp: Path, address: str) -> dict[str, tuple[int, int]]:
    storage = records(tmp)
    with ChangelogClient(address) as client:
        return decode_state(checkpoint_rows(storage.load(storage.batch_ids()[-1]), client))


def test_restore_a_chosen_checkpoint_and_go_on_as_if_stopped_there(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    write_input(tmp_path / "input", 0, 5, ROWS, KEYS)
    run(spark, tmp_path, sidecar, agg, until=5)
    assert records(tmp_path).batch_ids() == [3, 4, 5]

    # roll back to batch 3 at the start of a fixed deployment
    run(spark, tmp_path, sidecar, fixed, until=5, restore_from=3)
    want_state, want_outputs = expected([1, 1, 1, 1, 2, 2])
    assert state_of(tmp_path, sidecar.address) == want_state
    assert read_outputs(tmp_path / "out") == want_outputs
    assert records(tmp_path).batch_ids() == [3, 4, 5]
    assert records(tmp_path, "checkpoints/superseded/").batch_ids() == []  # superseded
    aside = list((tmp_path / "ckpt" / "superseded").glob("*-to-3/spark/offsets/*"))
    assert sorted(p.name for p in aside if not p.name.startswith(".")) == ["4", "5"]

    # on the stopped job, with the CLI: back to batch 4, then the first function again
    code = main(["checkpoints", "restore", "4", "--checkpoint-dir", str(tmp_path / "ckpt")])
    assert code == 0
    assert records(tmp_path).batch_ids() == [3, 4]
    assert records(tmp_path, "checkpoints/superseded/").batch_ids() == [5]
    run(spark, tmp_path, sidecar, agg, until=5)
    want_state, want_outputs = expected([1, 1, 1, 1, 2, 1])
    assert state_of(tmp_path, sidecar.address) == want_state
    assert read_outputs(tmp_path / "out") == want_outputs
    assert records(tmp_path, "checkpoints/superseded/").batch_ids() == []
