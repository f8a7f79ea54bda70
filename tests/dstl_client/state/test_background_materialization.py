"""Materialization in the background, across batches (FLIP-158), against a real sidecar.

A materialization never holds a batch: batches complete and are recorded
while it uploads; a later task reports it; the changelog is truncated only
once the driver recorded it; at most one runs per subtask.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from dstl_client.batch.local import LocalRunner
from dstl_client.checkpoint.messages import MAT_NOT_HERE, MAT_PROCESS_EXITED, BatchPlan
from dstl_client.checkpoint.records import NO_BATCH
from dstl_client.client import ChangelogClient, ChangelogWriter
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.keygroups import key_group_range_for_operator
from dstl_client.state.mat_slot import RECORD_NAME, RUNNING, MaterializationSlot, SlotRecord
from dstl_client.state.store import LocalKeyedStore
from dstl_client.state.store_dirs import store_dir
from dstl_server.testing import ServerProcess
from tests.dstl_client.state._jobs import (
    MAX_P,
    final_state,
    make_batches,
    make_coordinator,
    reference,
    runner,
)

BATCHES = make_batches(6, rows=300, keys=60, seed=11)
WAIT_S = 60.0


class GatedClient(ChangelogClient):
    """A real client whose materialization writers wait for :attr:`gate` (bounded)."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.gate = threading.Event()
        self.waiting = threading.Semaphore(0)

    def create_writer(
        self, *, job_id: str, operator_id: str, key_group_range: tuple[int, int]
    ) -> ChangelogWriter:
        if operator_id.endswith(".mat"):
            self.waiting.release()
            if not self.gate.wait(WAIT_S):
                raise TimeoutError("gate not opened")
        return super().create_writer(
            job_id=job_id, operator_id=operator_id, key_group_range=key_group_range
        )


def _join_materializations() -> None:
    for t in threading.enumerate():
        if t.name.startswith("dstl-materialize-"):
            t.join(WAIT_S)
            assert not t.is_alive(), t.name


def _start(
    tmp_path: Path, sidecar: ServerProcess, client: GatedClient, job_id: str
) -> tuple[CheckpointCoordinator, LocalRunner]:
    """A job materializing whenever none runs, its tasks never waiting for one."""
    client.wait_ready()
    coord = make_coordinator(
        tmp_path,
        sidecar.address,
        job_id=job_id,
        interval=0.0,
        client=client,
        materialization_wait_s=0.0,
    )
    return coord, runner(coord, 2, client)


def _round_0_uploaded_unreported(
    tmp_path: Path, sidecar: ServerProcess, client: GatedClient, job_id: str
) -> tuple[CheckpointCoordinator, LocalRunner, BatchPlan]:
    """Batches 0 and 1 recorded; batch 1's tasks started the round of version 0, whose
    uploads ended after batch 1 was recorded (nothing reported yet). Returns batch 1's plan."""
    coord, run = _start(tmp_path, sidecar, client, job_id)
    assert run.run_batch(0, BATCHES[0]) is not None
    plan = coord.plan_batch(1, 2)
    assert plan is not None and plan.mat_round == 0
    _, results = run.run_tasks(plan, BATCHES[1])
    coord.complete_batch(plan, results)  # both uploads blocked: nothing reported
    client.gate.set()
    _join_materializations()
    return coord, run, plan


def _segments_per_batch(coord: Any) -> list[int]:
    return sorted({s.batch for s in coord.latest.segments})


def test_batches_complete_while_a_materialization_uploads(
    tmp_path: Path, sidecar: ServerProcess
) -> None:
    client = GatedClient(sidecar.address)
    with client:
        coord, run = _start(tmp_path, sidecar, client, "bg")
        assert run.run_batch(0, BATCHES[0]) is not None
        # batch 1 starts the round of version 0; its tasks do not wait for it
        plan = coord.plan_batch(1, 2)
        assert plan is not None and plan.materialize and plan.mat_round == 0
        _, results = run.run_tasks(plan, BATCHES[1])
        for _ in range(2):  # both subtasks' uploads are blocked, not finished
            assert client.waiting.acquire(timeout=WAIT_S)
        assert all(r.mat is None and not r.mat_error for r in results)
        coord.complete_batch(plan, results)
        assert coord.latest is not None and not coord.latest.parts
        # batch 2: the round is in flight, no new one starts, the tasks report nothing yet
        plan = coord.plan_batch(2, 2)
        assert plan is not None and not plan.materialize and plan.mat_round == 0
        _, results = run.run_tasks(plan, BATCHES[2])
        assert all(r.mat is None and not r.mat_error for r in results)
        coord.complete_batch(plan, results)
        assert coord.history[-1].materialized is False
        assert _segments_per_batch(coord) == [0, 1, 2]  # nothing truncated
        # every slot says running, for the round in flight
        for i in range(2):
            rng = key_group_range_for_operator(i, 2, MAX_P)
            d = store_dir(tmp_path / "state", "bg", "keyed", rng)
            assert MaterializationSlot(d).read() == SlotRecord(
                0, RUNNING, round_id=plan.mat_round_id
            )
        client.gate.set()
        _join_materializations()
        # batch 3's tasks report the finished round; the record takes it
        plan = coord.plan_batch(3, 2)
        assert plan is not None and not plan.materialize and plan.mat_round == 0
        _, results = run.run_tasks(plan, BATCHES[3])
        assert [r.mat_batch for r in results] == [0, 0]
        assert all(r.mat is not None and r.mat.batch == 0 for r in results)
        coord.complete_batch(plan, results)
        rec = coord.latest
        assert rec is not None and len(rec.parts) == 2
        assert {b for _, b in rec.mat_per_kg()} == {0}
        assert coord.history[-1].materialized is True
        assert _segments_per_batch(coord) == [1, 2, 3]  # batch 0's changes are in the parts
        # the round ended: none in flight until the next is due; the next tasks clear
        # the slots (the record holds them) and truncate the log below the parts
        coord.set_materialize_interval(3600)
        plan = coord.plan_batch(4, 2)
        assert plan is not None and not plan.materialize and plan.mat_round == NO_BATCH
        _, results = run.run_tasks(plan, BATCHES[4])
        coord.complete_batch(plan, results)
        assert run.run_batch(5, BATCHES[5]) is not None
        for i in range(2):
            rng = key_group_range_for_operator(i, 2, MAX_P)
            d = store_dir(tmp_path / "state", "bg", "keyed", rng)
            assert not (d / RECORD_NAME).exists()
            with LocalKeyedStore(d, rng) as store:
                truncated = int(store.meta("truncated_before", "0"))
            assert truncated > 0  # the log was truncated below what the parts hold
        # the checkpoint (parts + tail), restored from scratch, is the reference state
        assert final_state(coord, client) == reference(BATCHES)
        coord.close()


def test_a_materialization_whose_process_died_fails_its_round_and_another_follows(
    tmp_path: Path, sidecar: ServerProcess
) -> None:
    client = GatedClient(sidecar.address)
    with client:
        coord, run, started = _round_0_uploaded_unreported(tmp_path, sidecar, client, "died")
        # subtask 1's materialization "ran in a worker that exited": its slot says
        # running and nobody holds the claim (subtask 0's finished for real)
        rng1 = key_group_range_for_operator(1, 2, MAX_P)
        d1 = store_dir(tmp_path / "state", "died", "keyed", rng1)
        MaterializationSlot(d1).write(SlotRecord(0, RUNNING, round_id=started.mat_round_id))
        plan = coord.plan_batch(2, 2)
        assert plan is not None
        _, results = run.run_tasks(plan, BATCHES[2])
        by_index = {r.index: r for r in results}
        assert by_index[0].mat is not None and not by_index[0].mat_error
        assert MAT_PROCESS_EXITED in by_index[1].mat_error
        coord.complete_batch(plan, results)
        stats = coord.history[-1]
        assert not stats.materialized and stats.mat_errors
        assert coord.latest is not None
        per_kg = coord.latest.mat_per_kg()
        # subtask 0's part is recorded, subtask 1's key groups are not materialized
        assert {per_kg[kg][1] for kg in key_group_range_for_operator(0, 2, MAX_P)} == {0}
        assert {per_kg[kg][1] for kg in rng1} == {NO_BATCH}
        # the next round (due at once) starts from batch 2; after a process exit its tasks
        # wait for their upload (a worker that exits takes it along), so it completes
        plan = coord.plan_batch(3, 2)
        assert plan is not None and plan.materialize and plan.mat_round == 2
        assert plan.materialization_wait_s == coord.config.materialization_timeout_s
        _, results = run.run_tasks(plan, BATCHES[3])
        assert all(r.mat is not None and r.mat.batch == 2 for r in results)
        coord.complete_batch(plan, results)
        assert coord.history[-1].materialized
        # once one completed, materializations go back to the background
        plan = coord.plan_batch(4, 2)
        assert plan is not None and plan.materialization_wait_s == 0.0
        _, results = run.run_tasks(plan, BATCHES[4])
        coord.complete_batch(plan, results)
        _join_materializations()
        assert run.run_batch(5, BATCHES[5]) is not None
        assert min(b for _, b in coord.latest.mat_per_kg()) >= 2  # every key group again
        assert final_state(coord, client) == reference(BATCHES)
        coord.close()


def test_a_subtask_whose_store_is_not_materializing_the_round_reports_it_not_here(
    tmp_path: Path, sidecar: ServerProcess
) -> None:
    """The task that started the round ran on another node: this store has no slot for it."""
    client = GatedClient(sidecar.address)
    with client:
        coord, run, _ = _round_0_uploaded_unreported(tmp_path, sidecar, client, "moved")
        # subtask 1's round ran "on the other node": nothing of it in this store's slot
        MaterializationSlot(store_dir(tmp_path / "state", "moved", "keyed", _rng(1))).clear()
        plan = coord.plan_batch(2, 2)
        assert plan is not None and not plan.materialize and plan.mat_round == 0
        _, results = run.run_tasks(plan, BATCHES[2])
        by_index = {r.index: r for r in results}
        assert by_index[0].mat is not None and not by_index[0].mat_error
        assert by_index[1].mat is None
        assert by_index[1].mat_error.startswith(f"{MAT_NOT_HERE} (batch 0)")
        coord.complete_batch(plan, results)
        assert not coord.history[-1].materialized
        # as after a process exit, the next round's tasks wait for their own upload
        plan = coord.plan_batch(3, 2)
        assert plan is not None and plan.materialize
        assert plan.materialization_wait_s == coord.config.materialization_timeout_s
        coord.close()


def test_a_materialization_of_a_dead_driver_is_not_taken_by_the_next_drivers_round(
    tmp_path: Path, sidecar: ServerProcess
) -> None:
    """A new driver's round of the same batch starts afresh: the old one's parts are orphans.

    The driver that started the round of version 0 dies before it records the
    batch whose tasks report it; the next driver sweeps unreferenced objects
    at its start (here with no grace), the old parts among them. Its own round
    of version 0 must not take the outcomes the slots still hold, or its
    record would reference deleted objects.
    """
    client = GatedClient(sidecar.address)
    client.gate.set()
    with client:
        first, run = _start(tmp_path, sidecar, client, "dead-driver")
        assert run.run_batch(0, BATCHES[0]) is not None
        plan = first.plan_batch(1, 2)
        assert plan is not None and plan.materialize and plan.mat_round == 0
        run.run_tasks(plan, BATCHES[1])
        _join_materializations()
        for i in range(2):  # both finished under the first driver, which never hears of it
            d = store_dir(tmp_path / "state", "dead-driver", "keyed", _rng(i))
            record = MaterializationSlot(d).read()
            assert record is not None and record.batch == 0 and record.outcome is not None
            assert record.outcome.result is not None and record.outcome.result.part is not None
        first.close()  # dies: batch 1 is not recorded

        second = make_coordinator(
            tmp_path,
            sidecar.address,
            job_id="dead-driver",
            interval=0.0,
            client=client,
            materialization_wait_s=WAIT_S,
            orphan_grace_s=0,
        )
        run = runner(second, 2, client)
        plan = second.plan_batch(1, 2)
        assert plan is not None and plan.materialize and plan.mat_round == 0
        _, results = run.run_tasks(plan, BATCHES[1])
        assert all(r.mat is not None and r.mat.batch == 0 for r in results)
        second.complete_batch(plan, results)
        assert second.history[-1].materialized
        second.set_materialize_interval(3600)  # the next record still holds these parts
        assert run.run_batch(2, BATCHES[2]) is not None
        # every object the record references exists, and the state restores from it
        rec = second.latest
        assert rec is not None and {b for _, b in rec.mat_per_kg()} == {0}
        stored = {o.key for o in client.list_objects("dead-driver")}
        assert rec.object_keys() <= stored, rec.object_keys() - stored
        assert final_state(second, client) == reference(BATCHES[:3])
        second.close()


def _rng(index: int) -> Any:
    return key_group_range_for_operator(index, 2, MAX_P)
