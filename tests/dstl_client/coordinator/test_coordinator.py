"""The checkpoint coordinator against a real sidecar on file:// storage."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstl_client.client import ChangelogClient, ChangelogWriter
from dstl_client.coordinator.batches import MaterializationFailed
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.core.errors import ConfigError, SidecarUnavailable, UploadFailed
from dstl_server.testing import ServerProcess, scrape_metrics
from tests.dstl_client.state._jobs import (
    final_state,
    make_batches,
    make_coordinator,
    reference,
    runner,
)

BATCHES = make_batches(6, rows=200, keys=50, seed=3)


def stored(objects_dir: Path, job: str) -> set[str]:
    root = objects_dir / job
    if not root.exists():
        return set()
    return {str(p.relative_to(objects_dir)) for p in root.rglob("*.dstl")}


def referenced(coord: CheckpointCoordinator) -> set[str]:
    keys: set[str] = set()
    for rec in coord.retained:
        keys |= rec.object_keys()
    return keys


def test_retained_checkpoints_keep_their_objects_and_nothing_else(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient, objects_dir: Path
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="retain", interval=0, retain=2)
    run = runner(coord, 2, client)
    for b, rows in enumerate(BATCHES):
        assert run.run_batch(b, rows) is not None
        assert coord.storage.batch_ids() == list(range(max(0, b - 1), b + 1))
        # every object a retained checkpoint needs exists; the rest was discarded
        assert stored(objects_dir, "retain") == referenced(coord)
    assert coord.registry.checkpoints == [4, 5]
    assert final_state(coord, client) == reference(BATCHES)
    coord.close()


def test_orphans_are_removed_on_start_before_new_checkpoints(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient, objects_dir: Path
) -> None:
    # no grace: every unreferenced object is an orphan (nothing else of the job runs)
    coord = make_coordinator(
        tmp_path, sidecar.address, job_id="orphans", orphan_grace_s=0, interval=0
    )
    run = runner(coord, 2, client)
    for b in range(3):
        assert run.run_batch(b, BATCHES[b]) is not None
    # the driver dies after batch 3's tasks uploaded their changes and a materialization
    plan = coord.plan_batch(3, 2)
    assert plan is not None and plan.materialize
    _, results = run.run_tasks(plan, BATCHES[3])
    orphans = set().union(*(r.object_keys() for r in results)) - referenced(coord)
    assert orphans and orphans <= stored(objects_dir, "orphans")
    before = referenced(coord)
    coord = make_coordinator(
        tmp_path, sidecar.address, job_id="orphans", orphan_grace_s=0, interval=0
    )
    assert coord.orphans_removed == len(orphans)
    assert stored(objects_dir, "orphans") == before == referenced(coord)
    run = runner(coord, 2, client)
    for b in range(3, 6):
        assert run.run_batch(b, BATCHES[b]) is not None
    assert final_state(coord, client) == reference(BATCHES)


def test_records_dropped_at_start_are_cleaned_without_a_grace_period(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient, objects_dir: Path
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="shrink", retain=4, interval=0)
    run = runner(coord, 2, client)
    for b in range(5):
        assert run.run_batch(b, BATCHES[b]) is not None
    # restart keeping fewer checkpoints: the older records and their objects go
    coord = make_coordinator(tmp_path, sidecar.address, job_id="shrink", retain=1, interval=0)
    assert coord.storage.batch_ids() == [4]
    assert stored(objects_dir, "shrink") == referenced(coord)
    assert final_state(coord, client) == reference(BATCHES[:5])


class MatFailingClient(ChangelogClient):
    """Fault injection: the materialization writers' uploads fail."""

    def create_writer(
        self, *, job_id: str, operator_id: str, key_group_range: tuple[int, int]
    ) -> ChangelogWriter:
        if operator_id.endswith(".mat"):
            raise UploadFailed("injected: the snapshot upload failed")
        return super().create_writer(
            job_id=job_id, operator_id=operator_id, key_group_range=key_group_range
        )


def test_consecutive_materialization_failures_stop_the_job(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    with MatFailingClient(sidecar.address) as bad:
        coord = make_coordinator(
            tmp_path,
            sidecar.address,
            job_id="matfail",
            interval=0,
            client=bad,
            max_materialization_failures=2,
        )
        run = runner(coord, 2, bad)
        assert run.run_batch(0, BATCHES[0]) is not None  # nothing to materialize yet
        assert run.run_batch(1, BATCHES[1]) is not None  # first failure: counted
        assert coord.history[-1].mat_errors
        with pytest.raises(MaterializationFailed, match="2 times in a row"):
            run.run_batch(2, BATCHES[2])
        # the batch's checkpoint was recorded before the error: its changes are safe
        assert coord.latest is not None and coord.latest.batch_id == 2
        assert final_state(coord, client) == reference(BATCHES[:3])
    # a healthy sidecar afterwards: the count restarts and materializations go through
    coord = make_coordinator(tmp_path, sidecar.address, job_id="matfail", interval=0)
    assert runner(coord, 2, client).run_batch(3, BATCHES[3]) is not None
    assert coord.history[-1].materialized


def test_metrics_and_skips(tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="metrics", interval=0)
    port = coord.metrics.serve(0)
    try:
        run = runner(coord, 2, client)
        for b in range(3):
            assert run.run_batch(b, BATCHES[b]) is not None
        assert run.run_batch(1, BATCHES[1]) is None  # already checkpointed
        m = scrape_metrics(port)
        assert m['dstl_driver_checkpoints_total{job_id="metrics"}'] == 3
        assert m['dstl_driver_skipped_batches_total{job_id="metrics"}'] == 1
        assert m['dstl_driver_last_checkpoint_batch{job_id="metrics"}'] == 2
        assert m['dstl_driver_materializations_total{job_id="metrics"}'] == 2
        assert m['dstl_driver_rows_total{job_id="metrics"}'] == 600
        assert m['dstl_driver_checkpoint_duration_seconds_count{job_id="metrics"}'] == 3
        assert m['dstl_driver_state_bytes{job_id="metrics"}'] > 0
        timeout = coord.config.checkpoint_timeout_s
        assert m['dstl_driver_checkpoint_timeout_seconds{job_id="metrics"}'] == timeout
        assert m['dstl_driver_materialize_interval_seconds{job_id="metrics"}'] == 0
        assert m['dstl_driver_last_materialization_timestamp_seconds{job_id="metrics"}'] > 0
    finally:
        coord.close()


def test_config_is_validated(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    with pytest.raises(ConfigError):
        make_coordinator(tmp_path, sidecar.address, job_id="bad/job")
    with pytest.raises(ConfigError):
        make_coordinator(tmp_path, sidecar.address, job_id="j", retain=0)
    make_coordinator(tmp_path, sidecar.address, job_id="j").close()
    # the checkpoints were taken with another max_parallelism
    from dstl_client.coordinator.config import CoordinatorConfig

    coord = make_coordinator(tmp_path, sidecar.address, job_id="j2")
    assert runner(coord, 1, client).run_batch(0, BATCHES[0]) is not None
    cfg = CoordinatorConfig(
        job_id="j2",
        checkpoint_dir=str(tmp_path / "ckpt"),
        max_parallelism=64,
        dstl_address=sidecar.address,
    )
    with pytest.raises(ConfigError, match="max_parallelism"):
        CheckpointCoordinator(cfg).start()


def test_young_orphans_are_kept_by_the_default_grace(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient, objects_dir: Path
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="young", interval=0)
    run = runner(coord, 2, client)
    assert run.run_batch(0, BATCHES[0]) is not None
    plan = coord.plan_batch(1, 2)
    assert plan is not None
    _, results = run.run_tasks(plan, BATCHES[1])  # the driver dies before the record
    orphans = set().union(*(r.object_keys() for r in results)) - referenced(coord)
    assert orphans
    # a restart within the grace period: the objects could belong to a batch in flight
    coord = make_coordinator(tmp_path, sidecar.address, job_id="young", interval=0)
    assert coord.orphans_removed == 0
    assert orphans <= stored(objects_dir, "young")


def test_two_keyed_operators_of_one_job_keep_each_others_objects(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient, objects_dir: Path
) -> None:
    """Both operators' records are under one checkpoint_dir: a sweep spares the other's."""

    def start(operator_id: str) -> CheckpointCoordinator:
        return make_coordinator(
            tmp_path,
            sidecar.address,
            job_id="two-ops",
            operator_id=operator_id,
            orphan_grace_s=0,
            interval=0,
        )

    a, b = start("keyed"), start("other")
    assert a.config.records_prefix != b.config.records_prefix
    for batch in range(4):
        assert runner(a, 2, client).run_batch(batch, BATCHES[batch]) is not None
        assert runner(b, 1, client).run_batch(batch, BATCHES[batch + 1]) is not None
    kept = referenced(a) | referenced(b)
    # each restart sweeps with no grace: the other operator's objects are referenced, so
    # only objects no record of either uses may go (an upload retried on a loaded machine
    # can leave one behind: that is an orphan, rightly swept)
    a, b = start("keyed"), start("other")
    assert referenced(a) | referenced(b) == kept
    assert stored(objects_dir, "two-ops") == kept
    assert final_state(a, client) == reference(BATCHES[:4])
    assert final_state(b, client) == reference(BATCHES[1:5])


class FailingSweeper:
    def sweep(self, referenced: object, *, now: float | None = None) -> int:
        raise SidecarUnavailable("injected: the sweep failed")


def test_a_failing_orphan_sweep_does_not_stop_the_start(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(
        tmp_path,
        sidecar.address,
        job_id="sweep-fails",
        sweeper=lambda _client, _job, _grace: FailingSweeper(),
    )
    assert coord.started and coord.orphans_removed == 0
    assert runner(coord, 2, client).run_batch(0, BATCHES[0]) is not None
    coord.close()


def test_close_writers_closes_the_last_batchs_writers(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="close-writers")
    run = runner(coord, 2, client)
    assert run.run_batch(0, BATCHES[0]) is not None
    before = sidecar.scrape_metrics()["dstl_writers"]
    assert coord.close_writers() == 2
    assert sidecar.scrape_metrics()["dstl_writers"] == before - 2
    assert coord.close_writers() == 0  # nothing left to close
    # the next run's tasks find their logs closed and start new ones
    plan = coord.plan_batch(1, 2)
    assert plan is not None
    _, results = run.run_tasks(plan, BATCHES[1])
    assert all(r.stats.new_writer for r in results)
    coord.complete_batch(plan, results)
    assert final_state(coord, client) == reference(BATCHES[:2])
    coord.close()


def test_a_long_tail_starts_a_materialization_before_the_interval(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    # every batch rewrites most of the 50 keys: a batch's changelog outweighs half
    # the materialized state, so with the ratio a round follows each one that ended
    # (a tail of a few KB: the floor of materialize_tail_min_bytes is lifted)
    for ratio, job in ((0.0, "by-time"), (0.5, "by-tail")):
        coord = make_coordinator(
            tmp_path / job,
            sidecar.address,
            job_id=job,
            materialize_tail_ratio=ratio,
            materialize_tail_min_bytes=0,
        )
        run = runner(coord, 2, client)
        for b in range(5):
            assert run.run_batch(b, BATCHES[b]) is not None
        materialized = [h.batch_id for h in coord.history if h.materialized]
        if ratio == 0:
            assert materialized == []  # the hour-long interval never came
        else:
            assert len(materialized) >= 2, materialized
            latest = coord.latest
            assert latest is not None and latest.parts
        assert final_state(coord, client) == reference(BATCHES[:5])
