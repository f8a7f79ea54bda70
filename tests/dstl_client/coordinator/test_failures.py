"""Tolerable checkpoint failures: which errors are retried, and the limit."""

from __future__ import annotations

import pytest

from dstl_client.coordinator.batches import IncompleteBatch
from dstl_client.coordinator.failures import CheckpointFailures, TooManyCheckpointFailures
from dstl_client.coordinator.metadata import MetadataStoreError
from dstl_client.coordinator.watchdog import CheckpointTimedOut


def test_checkpoint_failures_are_retried_up_to_the_limit_then_fail_the_query() -> None:
    failures = CheckpointFailures(lambda: 2)
    assert failures.retry(7, CheckpointTimedOut("slow"), aborted=False)
    assert failures.retry(7, MetadataStoreError("store down"), aborted=False)
    with pytest.raises(
        TooManyCheckpointFailures, match=r"3 consecutive .*batch 7.*IncompleteBatch"
    ):
        failures.retry(7, IncompleteBatch("a subtask is missing"), aborted=False)


def test_a_recorded_checkpoint_resets_the_count() -> None:
    failures = CheckpointFailures(lambda: 1)
    assert failures.retry(1, CheckpointTimedOut("slow"), aborted=False)
    failures.succeeded()
    assert failures.retry(2, CheckpointTimedOut("slow"), aborted=False)
    assert failures.tolerated == 2


def test_an_aborted_batch_is_a_checkpoint_failure_whatever_spark_raised() -> None:
    failures = CheckpointFailures(lambda: 1)
    # the watchdog cancelled the batch's Spark jobs: Spark raises its own error
    assert failures.retry(3, RuntimeError("Job cancelled"), aborted=True)


def test_other_errors_are_not_retried_and_zero_tolerates_nothing() -> None:
    failures = CheckpointFailures(lambda: 5)
    assert not failures.retry(1, ValueError("a bug in the user's function"), aborted=False)
    assert failures.consecutive == 0
    strict = CheckpointFailures(lambda: 0)
    with pytest.raises(TooManyCheckpointFailures):
        strict.retry(1, CheckpointTimedOut("slow"), aborted=False)
