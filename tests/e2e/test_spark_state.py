"""Real PySpark jobs with keyed state on the DSTL: crashes, retries, rescaling, cleanup."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from dstl_client.batch.local import checkpoint_rows
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.metadata import open_metadata_store
from dstl_client.coordinator.storage import CheckpointStorage
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from tests.e2e._faults import FailAfterCommit
from tests.e2e._harness import run_driver as run_job
from tests.e2e._spark_job import (
    OUTPUT_COLUMNS,
    agg,
    decode_state,
    expected,
    read_outputs,
    start_agg,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS, KEYS = 2000, 700


def records(checkpoint_dir: Path) -> CheckpointStorage:
    return CheckpointStorage(checkpoint_dir / "dstl" / "checkpoints")


def referenced(checkpoint_dir: Path) -> set[str]:
    storage = records(checkpoint_dir)
    keys: set[str] = set()
    for b in storage.batch_ids():
        keys |= storage.load(b).object_keys()
    return keys


def stored(sidecar: ServerProcess, job: str) -> set[str]:
    root = Path(sidecar.storage.removeprefix("file://"))
    return {str(p.relative_to(root)) for p in (root / job).rglob("*.dstl")}


def final_state(checkpoint_dir: Path, address: str) -> dict[str, tuple[int, int]]:
    storage = records(checkpoint_dir)
    with ChangelogClient(address) as client:
        return decode_state(checkpoint_rows(storage.load(storage.batch_ids()[-1]), client))


def run_driver(
    tmp: Path,
    sidecar: ServerProcess,
    until: int,
    crash: str = "",
    *,
    state_dir: Path | None = None,
    extra: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """One driver process of ``tests.e2e._spark_job``; ``extra``: more of its options."""
    options = {
        "checkpoint-dir": tmp / "ckpt",
        "address": sidecar.address,
        "state-dir": state_dir or tmp / "state",
        "input-dir": tmp / "input",
        "out-dir": tmp / "out",
        "until-batch": until,
        "crash": crash,
        **(extra or {}),
    }
    return run_job("tests.e2e._spark_job", options, env=env)


def test_driver_kills_at_every_point_give_the_failure_free_results(
    tmp_path: Path, sidecar: ServerProcess
) -> None:
    batches = 8
    write_input(tmp_path / "input", 0, batches - 1, ROWS, KEYS)
    # kill -9 before the tasks of batch 1, after the tasks of batch 3 (objects uploaded,
    # no record) and after the record of batch 5 (Spark has not committed it)
    assert run_driver(tmp_path, sidecar, until=7, crash="planned:1") == -signal.SIGKILL
    assert records(tmp_path / "ckpt").batch_ids() == [0]
    assert run_driver(tmp_path, sidecar, until=7, crash="tasks_done:3") == -signal.SIGKILL
    assert records(tmp_path / "ckpt").batch_ids()[-1] == 2
    orphans = stored(sidecar, "e2e-crash") - referenced(tmp_path / "ckpt")
    assert orphans, "batch 3's tasks uploaded objects no checkpoint refers to"
    assert run_driver(tmp_path, sidecar, until=7, crash="recorded:5") == -signal.SIGKILL
    # the restart removed the orphans before its first checkpoint, and kept what
    # the retained checkpoints refer to
    assert not orphans & stored(sidecar, "e2e-crash")
    assert records(tmp_path / "ckpt").batch_ids()[-1] == 5
    assert run_driver(tmp_path, sidecar, until=7) == 0
    assert records(tmp_path / "ckpt").batch_ids() == [6, 7]
    assert stored(sidecar, "e2e-crash") >= referenced(tmp_path / "ckpt")

    want_state, want_outputs = expected(batches, ROWS, KEYS)
    assert final_state(tmp_path / "ckpt", sidecar.address) == want_state
    # the idempotent sink saw every batch's output exactly as a failure-free run would
    assert read_outputs(tmp_path / "out") == want_outputs


@pytest.mark.s3
def test_a_driver_restarted_on_a_fresh_machine_resumes_from_metadata_in_s3(
    tmp_path: Path, sidecar: ServerProcess, weed_s3: SeaweedS3, s3_prefix: str
) -> None:
    """The job metadata in S3: the second driver has none of the first one's local disk."""
    batches, rows, keys = 4, 600, 200
    write_input(tmp_path / "input", 0, batches - 1, rows, keys)
    url = f"s3://{weed_s3.bucket}/{s3_prefix}/dstl"
    options = {
        "job-id": "e2e-s3-metadata",
        "metadata-url": url,
        "metadata-s3-endpoint-url": weed_s3.endpoint_url,
        "metadata-s3-region": weed_s3.region,
    }
    env = weed_s3.env()  # the AWS credential variables (boto3's default chain)
    # kill -9 after batch 1's record is in S3, before Spark committed batch 1
    first = run_driver(
        tmp_path, sidecar, 3, "recorded:1", state_dir=tmp_path / "node-a", extra=options, env=env
    )
    assert first == -signal.SIGKILL
    assert not (tmp_path / "ckpt" / "dstl").exists()  # no metadata on the local disk
    # another machine: an empty state directory; only Spark's own checkpoint is kept
    second = run_driver(tmp_path, sidecar, 3, state_dir=tmp_path / "node-b", extra=options, env=env)
    assert second == 0
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        store = open_metadata_store(
            url, s3_endpoint_url=weed_s3.endpoint_url, s3_region=weed_s3.region
        )
    try:
        records = CheckpointStorage(store, "checkpoints/")
        assert records.batch_ids() == [2, 3]
        last = records.load(3)
    finally:
        store.close()
    with ChangelogClient(sidecar.address) as client:
        state = decode_state(checkpoint_rows(last, client))
    want_state, want_outputs = expected(batches, rows, keys)
    assert state == want_state
    # batch 1 was recorded, not committed: the restart skipped it (its record was in S3)
    assert read_outputs(tmp_path / "out") == want_outputs


def test_a_task_failure_after_commit_is_retried_without_double_counting(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    batches = 4
    write_input(tmp_path / "input", 0, batches - 1, ROWS, KEYS)
    # batch 2, task 1: state applied, persisted and committed locally, then the attempt fails
    fn = FailAfterCommit(agg, OUTPUT_COLUMNS, batch_id=2, partition=1)
    q = start_agg(spark, tmp_path, sidecar, 2, fn=fn)
    try:
        q.wait_for_batch(batches - 1, timeout_s=180)
    finally:
        q.stop()
    by_batch = {h.batch_id: h for h in q.history}
    assert by_batch[2].max_task_attempt == 1  # Spark ran the task a second time
    # the retry found the failed attempt's batch in the store and dropped it: no restore
    assert all(h.restored_subtasks == 0 for h in q.history)
    want_state, want_outputs = expected(batches, ROWS, KEYS)
    assert final_state(tmp_path / "ckpt", sidecar.address) == want_state
    assert read_outputs(tmp_path / "out") == want_outputs


def test_rescale_2_3_1_gives_the_same_results(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    writers = sidecar.scrape_metrics()["dstl_writers"]
    done = -1
    for parallelism, batches, interval in ((2, 3, 3600.0), (3, 3, 0.0), (1, 2, 3600.0)):
        write_input(tmp_path / "input", done + 1, done + batches, ROWS, KEYS)
        q = start_agg(spark, tmp_path, sidecar, parallelism, materialize_interval_s=interval)
        try:
            q.wait_for_batch(done + batches, timeout_s=180)
        finally:
            q.stop()
        # stopping the query closed its changelog writers at the sidecar
        assert sidecar.scrape_metrics()["dstl_writers"] == writers
        first = next(h for h in q.history if h.batch_id == done + 1)
        if done >= 0:  # every subtask of the new parallelism restored its key groups
            assert first.restored_subtasks == parallelism
        done += batches
    want_state, want_outputs = expected(done + 1, ROWS, KEYS)
    assert final_state(tmp_path / "ckpt", sidecar.address) == want_state
    assert read_outputs(tmp_path / "out") == want_outputs
