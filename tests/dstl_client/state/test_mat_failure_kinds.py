"""Each way a materialization round ends without a result is reported as its kind
(``MatFailure``), and the driver reacts to the kind, never to the words of the error."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from dstl_client.checkpoint.messages import (
    MAT_PROCESS_EXITED,
    BatchPlan,
    MatFailure,
    TaskResult,
)
from dstl_client.client import ChangelogClient, ChangelogWriter
from dstl_client.coordinator.batches import MaterializationSchedule
from dstl_client.core.errors import SidecarUnavailable
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.mat_slot import RUNNING, MaterializationSlot, MatOutcome, SlotRecord
from dstl_client.state.materialize import TaskMaterialization
from dstl_client.state.store import LocalKeyedStore, SnapshotReader
from dstl_server.testing import ServerProcess

RANGE = KeyGroupRange(0, 3)
ROUND_ID = "r1"


class FailingClient(ChangelogClient):
    """A real client whose materialization writers cannot be created (the sidecar refuses)."""

    def create_writer(
        self, *, job_id: str, operator_id: str, key_group_range: tuple[int, int]
    ) -> ChangelogWriter:
        raise SidecarUnavailable("no writer for a materialization today")


def _plan(materialize: bool) -> BatchPlan:
    return BatchPlan(
        job_id="kinds",
        operator_id="keyed",
        batch_id=1,
        parallelism=1,
        max_parallelism=4,
        state_dir="/unused",
        committed=None,
        materialize=materialize,
        mat_round=0,
        mat_round_id=ROUND_ID,
        materialization_wait_s=30.0,
    )


def _task(tmp_path: Path, client: ChangelogClient, materialize: bool) -> TaskMaterialization:
    return TaskMaterialization(
        _plan(materialize), 0, RANGE, client, MaterializationSlot(tmp_path / "store")
    )


def _no_reader() -> SnapshotReader:
    raise sqlite3.OperationalError("disk I/O error")


@pytest.fixture
def store(tmp_path: Path) -> LocalKeyedStore:
    """A store at version 0 whose key group 1 changed (what a round of version 0 uploads)."""
    s = LocalKeyedStore(tmp_path / "store", RANGE)
    s.begin()
    s.write_main([(1, b"k", b"v")])
    s.mark_changed({1: 0})
    s.set_meta(main_version=0, main_attempt="a")
    s.commit()
    return s


def test_each_way_a_round_fails_is_reported_with_its_kind(
    tmp_path: Path, sidecar: ServerProcess, store: LocalKeyedStore
) -> None:
    with FailingClient(sidecar.address) as client:
        # its process exited: the slot says running, nobody holds the claim
        slot = MaterializationSlot(tmp_path / "store")
        slot.write(SlotRecord(0, RUNNING, round_id=ROUND_ID))
        task = _task(tmp_path, client, materialize=False)
        task.at_open(0, store.snapshot_reader)
        assert task.report is not None and task.report.failure is MatFailure.PROCESS_EXITED
        assert task.report.error == MAT_PROCESS_EXITED

        # not here: the round runs on another node, this store has nothing of it
        task = _task(tmp_path, client, materialize=False)
        task.at_open(0, store.snapshot_reader)
        assert task.report is not None and task.report.failure is MatFailure.NOT_HERE

        # not started: the snapshot reader cannot be opened
        task = _task(tmp_path, client, materialize=True)
        task.at_open(0, _no_reader)
        assert task.report is not None and task.report.failure is MatFailure.NOT_STARTED

        # busy: a materialization of another round holds the slot
        other = MaterializationSlot(tmp_path / "store")
        claim = other.claim()
        assert claim is not None
        try:
            other.write(SlotRecord(0, RUNNING, round_id="another round"))
            task = _task(tmp_path, client, materialize=True)
            task.at_open(0, store.snapshot_reader)
            assert task.report is not None and task.report.failure is MatFailure.BUSY
        finally:
            claim.release()
        other.clear()

        # error: the upload itself fails (here: the sidecar refuses its writer)
        task = _task(tmp_path, client, materialize=True)
        task.at_open(0, store.snapshot_reader)
        assert task.report is None  # started, in the background
        task.at_finish()
        assert task.report is not None and task.report.failure is MatFailure.ERROR
        assert "SidecarUnavailable" in task.report.error
    store.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("dstl-materialize-")]


def test_the_kind_travels_in_the_slot_record_and_the_task_result() -> None:
    for kind in MatFailure:
        outcome = MatOutcome(batch=3, error="words", failure=kind)
        assert MatOutcome.from_json(outcome.to_json()) == outcome
        res = TaskResult(0, 0, 3, 4, "a", None, mat_error="words", mat_failure=kind, mat_batch=3)
        assert TaskResult.from_bytes(res.to_bytes()) == res
    ok = TaskResult(0, 0, 3, 4, "a", None)
    assert TaskResult.from_bytes(ok.to_bytes()).mat_failure is None
    # a report written before the kinds (an error, no kind) is a plain error
    old = MatOutcome.to_json(MatOutcome(batch=3, error="E: boom"))
    del old["failure"]
    assert MatOutcome.from_json(old).failure is MatFailure.ERROR


def _failed_round(failure: MatFailure, words: str) -> MaterializationSchedule:
    clock = [1000.0]
    s = MaterializationSchedule(lambda: clock[0])
    clock[0] += 1
    assert s.plan(1, 1, 0, 600) == (True, 1)
    res = TaskResult(0, 0, 3, 2, "a", None, mat_error=words, mat_failure=failure, mat_batch=1)
    plan = BatchPlan(
        job_id="j",
        operator_id="op",
        batch_id=2,
        parallelism=1,
        max_parallelism=4,
        state_dir="/unused",
        committed=None,
        materialize=True,
        mat_round=1,
        mat_round_id=s.round_id,
    )
    assert s.completed(s.accepted(plan, [res])) is False
    return s


@pytest.mark.parametrize("failure", list(MatFailure))
def test_the_driver_reacts_to_the_kind_not_to_the_words(failure: MatFailure) -> None:
    # the words of a lost upload with another kind: the next rounds stay in the background
    s = _failed_round(failure, f"{MAT_PROCESS_EXITED} (batch 1)")
    assert s.wait_s(0.0, 600.0) == (600.0 if failure.lost else 0.0)
    # a lost upload in other words: the next rounds' tasks wait for theirs
    s = _failed_round(failure, "gone")
    assert s.wait_s(0.0, 600.0) == (600.0 if failure.lost else 0.0)
    assert failure.lost == (failure in (MatFailure.PROCESS_EXITED, MatFailure.NOT_HERE))
