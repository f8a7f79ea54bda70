"""The driver's materialization rounds: one at a time, in the background, counted once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dstl_client.checkpoint.messages import (
    MAT_NOT_HERE,
    MAT_PROCESS_EXITED,
    BatchPlan,
    MatFailure,
    MatResult,
    TaskResult,
)
from dstl_client.checkpoint.records import NO_BATCH, CheckpointRecord, Segment
from dstl_client.coordinator.batches import (
    MaterializationFailed,
    MaterializationSchedule,
    tail_outgrew,
    tail_share,
)
from dstl_client.core.handle import ChangelogHandle, HandleEntry
from dstl_client.keygroups import key_group_range_for_operator
from tests.fakes import ManualClock

MAX_P = 8


def plan(
    s: MaterializationSchedule, batch: int, p: int, materialize: bool, mat_round: int
) -> BatchPlan:
    """A plan made while ``s`` has its current round (named by its id, as the coordinator does)."""
    return BatchPlan(
        job_id="j",
        operator_id="op",
        batch_id=batch,
        parallelism=p,
        max_parallelism=MAX_P,
        state_dir="/nowhere",
        committed=None,
        materialize=materialize,
        mat_round=mat_round,
        mat_round_id=s.round_id,
    )


#: the kind of failure a task reports with the words of each (the driver reads the kind)
KINDS = {MAT_PROCESS_EXITED: MatFailure.PROCESS_EXITED, MAT_NOT_HERE: MatFailure.NOT_HERE}


def result(batch: int, i: int, p: int, mat_batch: int = NO_BATCH, error: str = "") -> TaskResult:
    rng = key_group_range_for_operator(i, p, MAX_P)
    words = error.split(" (batch")[0]
    failure = KINDS.get(words, MatFailure.ERROR) if error else None
    mat = None
    if mat_batch != NO_BATCH and not error:
        mat = MatResult(mat_batch, None, (), tuple(range(rng.first, rng.last + 1)))
    return TaskResult(
        index=i,
        first=rng.first,
        last=rng.last,
        batch_id=batch,
        attempt="a",
        changelog=None,
        mat=mat,
        mat_error=error,
        mat_failure=failure,
        mat_batch=mat_batch,
    )


def test_a_round_starts_when_due_runs_across_batches_and_completes() -> None:
    clock = ManualClock()
    s = MaterializationSchedule(clock)
    assert s.plan(4, 2, interval_s=10, timeout_s=600) == (False, NO_BATCH)  # not due yet
    clock.now += 10
    # due: the round of the latest record (4) starts; tasks start it while 4 is the latest
    assert s.plan(4, 2, 10, 600) == (True, 4)
    assert s.plan(4, 2, 10, 600) == (True, 4)  # the batch re-planned (e.g. re-run)
    # batch 5 recorded without reports; the round stays in flight, none other starts
    assert (
        s.completed(s.accepted(plan(s, 5, 2, True, 4), [result(5, 0, 2), result(5, 1, 2)])) is None
    )
    clock.now += 100
    assert s.plan(5, 2, 10, 600) == (False, 4)
    # subtask 1 reports in batch 6, subtask 0 in batch 7: the round completes then
    res6 = s.accepted(plan(s, 6, 2, False, 4), [result(6, 0, 2), result(6, 1, 2, 4)])
    assert not s.would_complete(res6)
    assert s.completed(res6) is None
    assert s.plan(6, 2, 10, 600) == (False, 4)
    res7 = s.accepted(plan(s, 7, 2, False, 4), [result(7, 0, 2, 4), result(7, 1, 2)])
    assert s.would_complete(res7)
    assert s.completed(res7) is True
    assert s.round is None and s.failures == 0
    # the next is due interval_s after this completion
    assert s.plan(7, 2, 10, 600) == (False, NO_BATCH)
    clock.now += 10
    assert s.plan(7, 2, 10, 600) == (True, 7)


def test_reports_of_other_rounds_and_repeated_ones_are_dropped() -> None:
    clock = ManualClock()
    s = MaterializationSchedule(clock)
    clock.now += 1
    assert s.plan(2, 2, 0, 600) == (True, 2)
    p3 = plan(s, 3, 2, True, 2)
    stale = result(3, 0, 2, mat_batch=1)  # a slot left by an earlier driver run
    taken = s.accepted(p3, [stale, result(3, 1, 2, 2)])
    assert taken[0].mat is None and taken[0].mat_batch == NO_BATCH
    assert taken[1].mat is not None
    assert s.completed(taken) is None
    # subtask 1 reports again (its batch failed after reporting, say): dropped now
    again = s.accepted(plan(s, 4, 2, False, 2), [result(4, 0, 2), result(4, 1, 2, 2)])
    assert again[1].mat is None
    # a report under a plan that names no round is dropped too
    dropped = s.accepted(plan(s, 4, 2, False, NO_BATCH), [result(4, 0, 2, 2)])
    assert dropped[0].mat is None
    # and one under a plan of another round of the same batch (another driver's, or
    # one abandoned earlier): same batch, another round id
    other = replace(plan(s, 4, 2, False, 2), mat_round_id="another-round")
    assert s.accepted(other, [result(4, 0, 2, 2)])[0].mat is None


def test_every_round_has_an_id_of_its_own() -> None:
    clock = ManualClock()
    s = MaterializationSchedule(clock)
    assert s.round_id == ""  # none in flight
    ids = []
    for _ in range(3):
        clock.now += 1
        assert s.plan(5, 2, 0, timeout_s=0.5) == (True, 5)  # the last one timed out
        ids.append(s.round_id)
    assert len(set(ids)) == 3 and all(ids)
    # a new schedule (a new driver) has new ids for the same batch
    t = MaterializationSchedule(clock)
    clock.now += 1
    assert t.plan(5, 2, 0, 600) == (True, 5)
    assert t.round_id not in ids


def test_failed_rounds_count_in_a_row_and_stop_the_job() -> None:
    clock = ManualClock()
    s = MaterializationSchedule(clock)
    for n in range(1, 4):
        clock.now += 1
        materialize, rnd = s.plan(n, 2, 0, 600)
        assert materialize and rnd == n
        res = s.accepted(
            plan(s, n + 1, 2, True, rnd),
            [result(n + 1, 0, 2, rnd), result(n + 1, 1, 2, rnd, error="boom")],
        )
        assert not s.would_complete(res)
        assert s.completed(res) is False
        assert s.failures == n
        if n < 3:
            s.raise_if_exhausted(3)
    with pytest.raises(MaterializationFailed, match=r"3 times in a row.*subtask 1: boom"):
        s.raise_if_exhausted(3)
    # one that completes resets the count
    clock.now += 1
    assert s.plan(9, 1, 0, 600) == (True, 9)
    assert s.completed(s.accepted(plan(s, 10, 1, True, 9), [result(10, 0, 1, 9)])) is True
    assert s.failures == 0


def test_a_round_not_finished_in_time_fails_and_a_rescale_abandons_one() -> None:
    clock = ManualClock()
    s = MaterializationSchedule(clock)
    clock.now += 1
    assert s.plan(1, 2, 0, timeout_s=60) == (True, 1)
    s.completed(s.accepted(plan(s, 2, 2, True, 1), [result(2, 0, 2, 1), result(2, 1, 2)]))
    clock.now += 61
    # subtask 1 never reported: the round fails and, due, the next one starts
    assert s.plan(2, 2, 0, 60) == (True, 2)
    assert s.failures == 1
    assert "subtasks [1]: not finished 60s" in s.last_errors[-1]
    # a rescale abandons the round in flight: neither a failure nor a success
    assert s.plan(3, 3, 3600, 60) == (False, NO_BATCH)
    assert s.round is None and s.failures == 1
    # results at the new parallelism carry nothing for the abandoned round
    res = s.accepted(plan(s, 4, 3, False, NO_BATCH), [result(4, 0, 3, 2)])
    assert res[0].mat is None


@pytest.mark.parametrize("reason", [MAT_PROCESS_EXITED, MAT_NOT_HERE])
def test_after_a_lost_upload_the_next_rounds_wait_inside_their_batch(reason: str) -> None:
    """A worker that exited, or a subtask whose next task ran on another node."""
    clock = ManualClock()
    s = MaterializationSchedule(clock)
    assert s.wait_s(0.0, 600.0) == 0.0
    clock.now += 1
    assert s.plan(1, 2, 0, 600) == (True, 1)
    res = s.accepted(
        plan(s, 2, 2, True, 1),
        [result(2, 0, 2, 1), result(2, 1, 2, 1, error=f"{reason} (batch 1)")],
    )
    assert s.completed(res) is False
    assert s.wait_s(0.0, 600.0) == 600.0  # tasks wait for theirs
    # another kind of failure does not change that; a completed round ends it
    assert s.plan(2, 2, 0, 600) == (True, 2)
    res = s.accepted(
        plan(s, 3, 2, True, 2), [result(3, 0, 2, 2), result(3, 1, 2, 2, error="UNAVAILABLE")]
    )
    assert s.completed(res) is False and s.wait_s(0.0, 600.0) == 600.0
    assert s.plan(3, 2, 0, 600) == (True, 3)
    res = s.accepted(plan(s, 4, 2, True, 3), [result(4, 0, 2, 3), result(4, 1, 2, 3)])
    assert s.completed(res) is True
    assert s.wait_s(0.0, 600.0) == 0.0


def handle(nbytes: int) -> ChangelogHandle:
    """A handle of one section of ``nbytes`` (what the trigger weighs)."""
    entry = HandleEntry(object_key="j/aa/x.dstl", offset=0, length=nbytes, first_sqn=0, end_sqn=1)
    return ChangelogHandle("j", "0" * 32, (0, MAX_P - 1), 0, 1, (entry,))


def record(part_bytes: list[int], tail_bytes: list[int]) -> CheckpointRecord:
    return CheckpointRecord(
        job_id="j",
        operator_id="op",
        batch_id=9,
        max_parallelism=MAX_P,
        parallelism=1,
        subtasks=(),
        parts={f"p{i}": handle(n) for i, n in enumerate(part_bytes)},
        segments=tuple(Segment(b, 0, MAX_P - 1, handle(n)) for b, n in enumerate(tail_bytes)),
    )


def test_the_tail_trigger_weighs_the_replayed_changelog_against_the_materialized_state() -> None:
    assert not tail_outgrew(None, 0.5)
    assert not tail_outgrew(record([1000], [400, 400]), 0)  # 0: by time only
    assert not tail_outgrew(record([600, 400], [300, 200]), 0.5)  # 500 of 1000: not over
    assert tail_outgrew(record([600, 400], [300, 201]), 0.5)
    assert tail_outgrew(record([], [1]), 0.5)  # nothing materialized yet
    assert not tail_outgrew(record([1000], []), 0.5)  # no tail


def test_a_tail_under_the_floor_starts_nothing_whatever_its_share() -> None:
    assert not tail_outgrew(record([], [999]), 0.5, min_bytes=1000)
    assert tail_outgrew(record([], [600, 400]), 0.5, min_bytes=1000)
    assert not tail_outgrew(record([10], [50, 49]), 0.5, min_bytes=1000)  # 10x the state


def test_the_tail_share_is_the_replayed_bytes_over_the_loaded_bytes() -> None:
    assert tail_share(record([600, 400], [300, 200])) == pytest.approx(0.5)
    assert tail_share(record([1000], [])) == 0.0  # no tail
    assert tail_share(record([], [1])) == float("inf")  # nothing materialized yet


def test_a_tail_over_the_ratio_starts_a_round_before_the_interval() -> None:
    clock = ManualClock()
    s = MaterializationSchedule(clock)
    assert s.plan(4, 2, interval_s=3600, timeout_s=600) == (False, NO_BATCH)
    assert s.plan(4, 2, 3600, 600, tail_due=True) == (True, 4)
    # one round at a time: a tail still over the ratio starts no other
    assert s.plan(5, 2, 3600, 600, tail_due=True) == (False, 4)
    res = s.accepted(plan(s, 5, 2, False, 4), [result(5, 0, 2, 4), result(5, 1, 2, 4)])
    assert s.completed(res) is True
    assert s.plan(5, 2, 3600, 600) == (False, NO_BATCH)  # the tail is short again
