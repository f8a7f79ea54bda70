"""A subtask's status guards its steps: open, persist, commit in order; a failed attempt stays failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstl_client.client import ChangelogClient
from dstl_client.state.serializers import INT64
from dstl_client.state.subtask import Subtask
from dstl_client.state.subtask_status import SubtaskStatus, SubtaskStatusError, SubtaskSteps
from dstl_server.testing import ServerProcess
from tests.dstl_client.state._jobs import make_coordinator


def _status(steps: SubtaskSteps) -> SubtaskStatus:
    """The status now (a call: mypy narrows an attribute across the steps)."""
    return steps.status


def test_steps_move_forward_only_and_a_failed_step_is_final() -> None:
    steps = SubtaskSteps()
    assert _status(steps) is SubtaskStatus.NEW
    with (
        pytest.raises(SubtaskStatusError) as wrong,
        steps.step("finish", SubtaskStatus.OPEN, SubtaskStatus.COMMITTED),
    ):
        raise AssertionError("a step in the wrong status must not run")
    assert wrong.value.status is SubtaskStatus.NEW and wrong.value.allowed is SubtaskStatus.OPEN
    assert _status(steps) is SubtaskStatus.NEW  # a refused step changes nothing
    with steps.step("open", SubtaskStatus.NEW, SubtaskStatus.OPEN):
        pass
    assert _status(steps) is SubtaskStatus.OPEN
    with (
        pytest.raises(ValueError),
        steps.step("finish", SubtaskStatus.OPEN, SubtaskStatus.COMMITTED),
    ):
        steps.reached(SubtaskStatus.PERSISTED)
        raise ValueError("the local commit failed")
    assert _status(steps) is SubtaskStatus.FAILED
    with (
        pytest.raises(SubtaskStatusError),
        steps.step("finish", SubtaskStatus.OPEN, SubtaskStatus.COMMITTED),
    ):
        pass
    assert _status(steps) is SubtaskStatus.FAILED


def test_a_subtask_runs_open_persisted_committed_and_refuses_steps_out_of_order(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="status")
    try:
        plan = coord.plan_batch(0, 1)
        assert plan is not None
        with Subtask(plan, 0, client) as task:
            assert _status(task.steps) is SubtaskStatus.NEW
            with pytest.raises(SubtaskStatusError):
                task.finish()  # nothing opened: nothing to persist
            assert _status(task.steps) is SubtaskStatus.NEW
            ctx = task.open()
            assert _status(task.steps) is SubtaskStatus.OPEN
            with pytest.raises(SubtaskStatusError):
                task.open()  # the store is locked once per attempt
            task.backend.set_current_key("k")
            ctx.value_state("n", INT64).update(1)
            result = task.finish()
            assert _status(task.steps) is SubtaskStatus.COMMITTED
            assert result.changelog is not None
            with pytest.raises(SubtaskStatusError):
                task.finish()  # a batch is persisted and committed once
        coord.complete_batch(plan, [result])

        # an attempt closed with an error is failed: no step runs on it again
        plan = coord.plan_batch(1, 1)
        assert plan is not None
        task = Subtask(plan, 0, client)
        with pytest.raises(RuntimeError, match="boom"), task:
            task.open()
            raise RuntimeError("boom")
        assert _status(task.steps) is SubtaskStatus.FAILED
        with pytest.raises(SubtaskStatusError):
            task.finish()
    finally:
        coord.close()
