"""The coordinator on a job metadata store away from its disk (S3), and drivers racing.

A driver restarted on another machine (empty checkpoint and state
directories) resumes from the last record in S3, with its REST overrides;
two drivers completing the same batch write one record, and the other gets
:class:`CheckpointExists`, on a shared directory and on S3 alike.
"""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import pytest

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.metadata import S3MetadataStore
from dstl_client.coordinator.storage import CheckpointExists
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from tests.dstl_client.coordinator._helpers import s3_env
from tests.dstl_client.state._jobs import (
    MAX_P,
    final_state,
    make_batches,
    make_coordinator,
    reference,
    runner,
)
from tests.fakes import MemoryMetadataStore

BATCHES = make_batches(5, rows=120, keys=40, seed=11)


def s3_metadata(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, Any], SeaweedS3, str]:
    """Coordinator options putting the job metadata on the session's SeaweedFS."""
    s3: SeaweedS3 = request.getfixturevalue("weed_s3")
    prefix: str = request.getfixturevalue("s3_prefix")
    s3_env(monkeypatch, s3)
    options = {
        "metadata_url": f"s3://{s3.bucket}/{prefix}/dstl",
        "metadata_s3_endpoint_url": s3.endpoint_url,
        "metadata_s3_region": s3.region,
    }
    return options, s3, prefix


@pytest.mark.s3
def test_a_driver_restarted_on_another_machine_resumes_from_the_records_in_s3(
    tmp_path: Path,
    sidecar: ServerProcess,
    client: ChangelogClient,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options, s3, prefix = s3_metadata(request, monkeypatch)
    first = make_coordinator(
        tmp_path / "node-a", sidecar.address, job_id="moved", interval=0, **options
    )
    assert isinstance(first.metadata, S3MetadataStore)
    assert first.overrides_location == f"{options['metadata_url']}/config-overrides.json"
    run = runner(first, 2, client)
    for b in range(3):
        assert run.run_batch(b, BATCHES[b]) is not None
    first.update_config(checkpoint_timeout_ms=45_000)
    first.close()
    # the records and the overrides are objects in the bucket; nothing went to the disk
    s3_client = s3.boto3_client()
    try:
        listed = s3_client.list_objects_v2(Bucket=s3.bucket, Prefix=f"{prefix}/dstl/")
        keys = sorted(o["Key"][len(prefix) + 6 :] for o in listed.get("Contents", ()))
    finally:
        s3_client.close()
    assert keys == [
        "checkpoints/ck-000000000001.json",
        "checkpoints/ck-000000000002.json",
        "config-overrides.json",
    ]
    assert not (tmp_path / "node-a" / "ckpt" / "dstl").exists()

    # another machine: empty checkpoint and state directories, the same metadata URL
    second = make_coordinator(
        tmp_path / "node-b", sidecar.address, job_id="moved", interval=0, **options
    )
    try:
        assert second.latest is not None and second.latest.batch_id == 2
        assert second.config.checkpoint_timeout_s == 45.0  # the override came along
        run = runner(second, 3, client)  # and a new parallelism
        assert run.run_batch(2, BATCHES[2]) is None  # already checkpointed: skipped
        for b in range(3, 5):
            assert run.run_batch(b, BATCHES[b]) is not None
        assert second.storage.batch_ids() == [3, 4]
        assert final_state(second, client) == reference(BATCHES)
    finally:
        second.close()


def _complete_together(
    coordinators: list[CheckpointCoordinator], client: ChangelogClient
) -> list[CheckpointRecord | BaseException]:
    """Each coordinator plans and runs batch 0, then all complete it at once."""
    work = []
    for coord in coordinators:
        plan = coord.plan_batch(0, 2)
        assert plan is not None
        work.append((coord, plan, runner(coord, 2, client).run_tasks(plan, BATCHES[0])[1]))
    barrier = threading.Barrier(len(work))

    def complete(i: int) -> CheckpointRecord | BaseException:
        coord, plan, results = work[i]
        barrier.wait()
        try:
            return coord.complete_batch(plan, results)
        except CheckpointExists as exc:
            return exc

    with concurrent.futures.ThreadPoolExecutor(len(work)) as pool:
        return list(pool.map(complete, range(len(work))))


@pytest.mark.parametrize("where", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_two_drivers_racing_for_a_batch_write_one_record(
    where: str,
    tmp_path: Path,
    sidecar: ServerProcess,
    client: ChangelogClient,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if where == "s3":
        options, _, _ = s3_metadata(request, monkeypatch)
    else:  # a directory both drivers share (NFS, say)
        options = {"metadata_url": str(tmp_path / "shared" / "dstl")}
    job = f"race-{where}"
    drivers = [
        make_coordinator(tmp_path / f"driver-{i}", sidecar.address, job_id=job, **options)
        for i in range(2)
    ]
    try:
        outcomes = _complete_together(drivers, client)
        records = [o for o in outcomes if isinstance(o, CheckpointRecord)]
        refused = [o for o in outcomes if isinstance(o, CheckpointExists)]
        assert len(records) == 1 and len(refused) == 1, outcomes
        message = refused[0].message
        assert "batch 0 already exists" in message and "another driver" in message
        assert options["metadata_url"] in message and job in message
        # the one record is the winner's, and the loser retained nothing
        assert drivers[0].storage.batch_ids() == [0]
        assert drivers[0].storage.load(0) == records[0]
        assert [d.latest for d in drivers].count(None) == 1
    finally:
        for d in drivers:
            d.close()
    # whoever comes next resumes from the winner's record
    again = make_coordinator(tmp_path / "driver-2", sidecar.address, job_id=job, **options)
    try:
        assert again.latest == records[0]
        assert final_state(again, client) == reference(BATCHES[:1])
    finally:
        again.close()


def test_coordinators_run_on_an_injected_store(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    """A store handed in (the fake here) holds everything: records and overrides."""
    store = MemoryMetadataStore()
    cfg = CoordinatorConfig(
        job_id="injected",
        checkpoint_dir=str(tmp_path / "ckpt"),
        max_parallelism=MAX_P,
        materialize_interval_s=0,
        state_dir=str(tmp_path / "state"),
        dstl_address=sidecar.address,
    )
    coord = CheckpointCoordinator(cfg, metadata=store)
    coord.start()
    run = runner(coord, 2, client)
    for b in range(2):
        assert run.run_batch(b, BATCHES[b]) is not None
    coord.update_config(materialization_interval_ms=5_000)
    coord.close()
    assert sorted(store.objects) == [
        "checkpoints/ck-000000000000.json",
        "checkpoints/ck-000000000001.json",
        "config-overrides.json",
    ]
    assert coord.overrides_location == "memory://job/config-overrides.json"
    assert not (tmp_path / "ckpt").exists()
    again = CheckpointCoordinator(cfg, metadata=store)
    assert again.start() is not None and again.config.materialize_interval_s == 5.0
    again.close()
