"""Subtasks against a real sidecar: changelog, copy-on-write retries, restore, rescale."""

from __future__ import annotations

import shutil
from pathlib import Path

from dstl_client.client import ChangelogClient
from dstl_client.keygroups import key_group_range_for_operator
from dstl_client.state.store import LocalKeyedStore, read_all_rows
from dstl_client.state.store_dirs import store_dir
from dstl_client.state.subtask import run_keyed
from dstl_server.testing import ServerProcess
from tests.dstl_client.state._jobs import (
    MAX_P,
    decode_rows,
    final_state,
    make_batches,
    make_coordinator,
    reference,
    runner,
)

BATCHES = make_batches(6, rows=300, keys=60)


def test_state_and_checkpoint_equal_the_reference(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="ref")
    run = runner(coord, 2, client)
    outputs = []
    for b, rows in enumerate(BATCHES):
        out = run.run_batch(b, rows)
        assert out is not None
        outputs.extend(out)
    want = reference(BATCHES)
    assert final_state(coord, client) == want
    # the last output of a key is its running count
    last = {k: c for k, c in outputs}
    assert last == {k: s["count"] for k, s in want.items()}
    # the node-local stores hold the state too (at the last version after a merge)
    plan = coord.plan_batch(len(BATCHES), 2)
    assert plan is not None
    local: dict[tuple[int, bytes], bytes] = {}
    for i in range(2):
        run_keyed(plan, i, [], lambda k, r, c: None, client=client)  # merges the last batch
        rng = key_group_range_for_operator(i, 2, MAX_P)
        with LocalKeyedStore(store_dir(plan.state_dir, "ref", "keyed", rng), rng) as store:
            local.update(read_all_rows(store))
    assert decode_rows(local) == want
    coord.close()


def test_a_retried_task_does_not_apply_changes_twice(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="retry")
    run = runner(coord, 2, client)
    for b, rows in enumerate(BATCHES):
        plan = coord.plan_batch(b, 2)
        assert plan is not None
        if b in (1, 4):
            # a first attempt runs to the end (changes applied locally and persisted),
            # but its result is lost; Spark runs the task again
            run.run_tasks(plan, rows)
        _, results = run.run_tasks(plan, rows)
        assert not any(r.stats.restored for r in results)
        coord.complete_batch(plan, results)
    assert final_state(coord, client) == reference(BATCHES)
    coord.close()


def test_driver_crashes_at_every_point_give_the_same_state(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    def restart() -> object:
        return make_coordinator(tmp_path, sidecar.address, job_id="crash")

    coord = restart()
    for b, rows in enumerate(BATCHES):
        run = runner(coord, 2, client)  # type: ignore[arg-type]
        if b == 1:  # crash before the tasks: nothing happened, Spark re-runs batch 1
            coord = restart()
            run = runner(coord, 2, client)  # type: ignore[arg-type]
        if b == 2:  # crash after the tasks, before our record: batch 2 is re-run
            plan = coord.plan_batch(b, 2)  # type: ignore[attr-defined]
            run.run_tasks(plan, rows)
            coord = restart()
            run = runner(coord, 2, client)  # type: ignore[arg-type]
        assert run.run_batch(b, rows) is not None
        if b == 3:  # crash after our record, before Spark's commit: batch 3 is re-run
            coord = restart()
            assert runner(coord, 2, client).run_batch(b, rows) is None  # type: ignore[arg-type]
    assert final_state(coord, client) == reference(BATCHES)  # type: ignore[arg-type]


def test_lost_local_state_is_restored_from_the_checkpoint(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="lost", interval=0)
    run = runner(coord, 2, client)
    for b, rows in enumerate(BATCHES):
        if b == 3:
            shutil.rmtree(tmp_path / "state")  # the node lost its disk
        plan = coord.plan_batch(b, 2)
        assert plan is not None
        _, results = run.run_tasks(plan, rows)
        assert all(r.stats.restored == (b == 3) for r in results)
        coord.complete_batch(plan, results)
    assert final_state(coord, client) == reference(BATCHES)


def test_rescale_2_3_1_gives_the_same_state(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="rescale")
    writers_before = sidecar.scrape_metrics()["dstl_writers"]
    for b, rows in enumerate(BATCHES):
        p = 2 if b < 2 else 3 if b < 4 else 1
        plan = coord.plan_batch(b, p)
        assert plan is not None
        _, results = runner(coord, p, client).run_tasks(plan, rows)
        if b in (2, 4):  # every subtask of the new parallelism restores its range
            assert all(r.stats.restored for r in results)
        coord.complete_batch(plan, results)
        if b == 3:
            # one materialization at parallelism 3, so the next restore mixes parts and logs
            coord.set_materialize_interval(0)
    assert final_state(coord, client) == reference(BATCHES)
    # the writers of the replaced ranges were closed: one writer is left, at parallelism 1
    assert sidecar.scrape_metrics()["dstl_writers"] - writers_before == 1


def test_materialization_is_incremental_and_prunes_the_log(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="incr", interval=0)
    run = runner(coord, 2, client)
    big = make_batches(1, rows=400, keys=200, seed=1)[0]
    assert run.run_batch(0, big) is not None
    assert run.run_batch(1, big) is not None  # materializes version 0: every key group
    rec = coord.latest
    assert rec is not None
    first = coord.history[-1]
    assert first.materialized and first.mat_kgs == MAX_P
    # segments before the materialized version are gone, batch 1's stays
    assert [s.batch for s in rec.segments] == [1, 1]
    # a batch touching one key only: the next materialization uploads one key group
    one = [{"k": "key-5", "v": 3, "page": "p1"}]
    assert run.run_batch(2, one) is not None
    assert run.run_batch(3, one) is not None
    stats = coord.history[-1]
    assert stats.materialized
    assert stats.mat_kgs == 1, stats
    rec = coord.latest
    assert rec is not None
    # the unchanged key groups still refer to batch 1's parts, now as of version 2
    assert {e.batch for e in rec.kg_map} == {2}
    assert len(rec.parts) == 3  # 2 parts of the first materialization + 1 new
    assert final_state(coord, client) == reference([big, big, one, one])
    # the sidecar was told to drop what the materializations cover
    plan = coord.plan_batch(4, 2)
    assert plan is not None
    _, results = run.run_tasks(plan, one)
    assert any(r.stats.truncated_before for r in results)


def test_a_sidecar_restart_starts_a_new_log(tmp_path: Path) -> None:
    batches = make_batches(4, rows=100, keys=30)
    storage = f"file://{tmp_path / 'objects'}"
    with ServerProcess(tmp_path / "s1", storage=storage) as s1, ChangelogClient(s1.address) as c1:
        coord = make_coordinator(tmp_path, s1.address, job_id="restart", client=c1)
        for b in range(2):
            assert runner(coord, 2, c1).run_batch(b, batches[b]) is not None
    # a new sidecar process on the same storage: the old log ids are unknown to it
    with ServerProcess(tmp_path / "s2", storage=storage) as s2, ChangelogClient(s2.address) as c2:
        coord._client = c2
        for b in range(2, 4):
            plan = coord.plan_batch(b, 2)
            assert plan is not None
            _, results = runner(coord, 2, c2).run_tasks(plan, batches[b])
            if b == 2:
                assert all(r.stats.new_writer for r in results)
            coord.complete_batch(plan, results)
        assert final_state(coord, c2) == reference(batches)
