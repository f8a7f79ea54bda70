"""UploadExecutor with hedging off against a scripted store, on a fake clock.

Retries, timeouts, the total deadline, cleanup of losing attempts, metrics,
and the retry classification of errors by type.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import replace

import pytest

from dstl_client.core.errors import (
    BlobNotFound,
    PermissionDenied,
    StorageError,
    TransientStorageError,
    UploadFailed,
)
from dstl_server.metrics import ServerMetrics
from dstl_server.upload_policy import UploadPolicy, is_retryable
from dstl_server.uploader import UploadExecutor
from tests.fakes import FakeClock, MemoryBlobStore, Outcome, latencies, sample

DATA = b"an object" * 100
FAST = UploadPolicy(
    attempt_timeout_s=5.0,
    max_attempts=3,
    retry_base_delay_s=0.001,
    retry_max_delay_s=0.005,
    hedge_mode="off",
)


def executor(
    store: MemoryBlobStore, policy: UploadPolicy = FAST, metrics: ServerMetrics | None = None
) -> UploadExecutor:
    """An engine on the store's fake clock."""
    clock = store.clock
    metrics = metrics or ServerMetrics()
    return UploadExecutor(store, policy, metrics, clock=clock.time, sleep=clock.sleep)


def uploader(
    script: Iterable[Outcome], policy: UploadPolicy = FAST
) -> tuple[UploadExecutor, MemoryBlobStore, ServerMetrics]:
    store = MemoryBlobStore(script)
    metrics = ServerMetrics()
    return executor(store, policy, metrics=metrics), store, metrics


@pytest.mark.asyncio
async def test_first_attempt_succeeds() -> None:
    up, store, metrics = uploader([None])
    key = await up.upload("job-1", DATA)
    assert re.fullmatch(r"job-1/[0-9a-f]{2}/[0-9a-f]{32}\.dstl", key)
    assert store.objects == {key: DATA}
    await up.close(1.0)
    assert store.deleted == []
    assert sample(metrics, "dstl_uploads_total", result="ok") == 1
    assert sample(metrics, "dstl_upload_attempts_sum") == 1
    assert sample(metrics, "dstl_upload_bytes_total") == len(DATA)
    assert sample(metrics, "dstl_upload_size_bytes_count") == 1
    assert sample(metrics, "dstl_upload_latency_seconds_count", size_class="lt256k") == 1
    assert sample(metrics, "dstl_upload_retries_total") == 0


@pytest.mark.parametrize(
    "failure",
    [
        TransientStorageError("503 slow down"),
        StorageError("connection reset", retryable=True),
    ],
)
@pytest.mark.asyncio
async def test_retryable_errors_are_retried_with_new_keys(failure: StorageError) -> None:
    up, store, metrics = uploader([failure, failure, None])
    key = await up.upload("job", DATA)
    assert len(store.put_keys) == 3 and len(set(store.put_keys)) == 3  # a new key per attempt
    assert key == store.put_keys[-1]
    assert store.objects == {key: DATA}
    await up.close(1.0)
    assert sorted(store.deleted) == sorted(store.put_keys[:2])  # failed attempts cleaned up
    assert sample(metrics, "dstl_upload_retries_total") == 2
    assert sample(metrics, "dstl_upload_attempts_sum") == 3
    assert sample(metrics, "dstl_storage_failures_total", op="put", kind=failure.kind) == 2
    assert sample(metrics, "dstl_uploads_total", result="ok") == 1
    assert sample(metrics, "dstl_uploads_total", result="failed") == 0


@pytest.mark.parametrize(
    ("failure", "raised"),
    [
        (StorageError("403 access denied"), StorageError),
        (BlobNotFound("no bucket"), BlobNotFound),
        (PermissionDenied("not yours"), PermissionDenied),
        (RuntimeError("a bug"), StorageError),
    ],
)
@pytest.mark.asyncio
async def test_non_retryable_errors_fail_at_once(
    failure: Exception, raised: type[Exception]
) -> None:
    up, store, metrics = uploader([failure, None])
    with pytest.raises(raised, match=r"after 1 attempt\(s\)") as info:
        await up.upload("job", DATA)
    assert type(info.value) is raised
    if isinstance(info.value, StorageError):
        assert not info.value.retryable
    assert len(store.put_keys) == 1
    await up.close(1.0)
    assert store.deleted == store.put_keys
    assert sample(metrics, "dstl_uploads_total", result="failed") == 1
    assert sample(metrics, "dstl_upload_retries_total") == 0


@pytest.mark.asyncio
async def test_attempts_are_bounded() -> None:
    failures = [TransientStorageError("503")] * 5
    up, store, metrics = uploader(failures)
    with pytest.raises(TransientStorageError, match=r"after 3 attempt\(s\)") as info:
        await up.upload("job", DATA)
    assert info.value.retryable
    assert len(store.put_keys) == 3 and store.objects == {}
    await up.close(1.0)
    assert sorted(store.deleted) == sorted(store.put_keys)
    assert sample(metrics, "dstl_uploads_total", result="failed") == 1
    assert sample(metrics, "dstl_upload_attempts_sum") == 3
    assert sample(metrics, "dstl_upload_retries_total") == 2


@pytest.mark.asyncio
async def test_timed_out_attempt_is_retried_and_deleted() -> None:
    """A put that reached the store but never answered leaves an object: it is removed."""
    policy = replace(FAST, attempt_timeout_s=0.05)
    up, store, metrics = uploader(["hang", None], policy)
    started = time.monotonic()
    key = await up.upload("job", DATA)
    assert time.monotonic() - started < 2.0
    hung = store.put_keys[0]
    assert key == store.put_keys[1] != hung
    await up.close(1.0)
    assert store.deleted == [hung]
    assert store.objects == {key: DATA}  # only the winning attempt's object remains
    assert sample(metrics, "dstl_storage_failures_total", op="put", kind="timeout") == 1
    assert sample(metrics, "dstl_upload_retries_total") == 1


@pytest.mark.asyncio
async def test_every_attempt_times_out() -> None:
    policy = replace(FAST, attempt_timeout_s=0.02, max_attempts=2)
    up, store, metrics = uploader(["hang", "hang"], policy)
    with pytest.raises(TransientStorageError, match=r"timed out after 2 attempt\(s\)"):
        await up.upload("job", DATA)
    await up.close(1.0)
    assert store.objects == {}
    assert sample(metrics, "dstl_storage_failures_total", op="put", kind="timeout") == 2


@pytest.mark.asyncio
async def test_failing_cleanup_does_not_fail_the_upload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryBlobStore([TransientStorageError("503"), None], fail_deletes=1)
    up = executor(store)
    key = await up.upload("job", DATA)
    await up.close(1.0)  # the failed delete is logged, not raised
    assert store.objects == {key: DATA}
    (record,) = [r for r in caplog.records if "could not delete" in r.getMessage()]
    # a structured field, not in the text
    assert record.__dict__["object_key"] == store.put_keys[0]


@pytest.mark.asyncio
async def test_close_is_bounded() -> None:
    clock = FakeClock()
    store = MemoryBlobStore([TransientStorageError("503"), None], clock=clock, hang_deletes=True)
    up = executor(store)
    await up.upload("job", DATA)
    started = time.monotonic()
    virtual = clock.time()
    await up.close(0.05)
    assert time.monotonic() - started < 1.0
    # past its timeout close cancels the stuck delete (and waits a bounded while more)
    assert clock.time() - virtual <= 0.05 + FAST.attempt_timeout_s
    assert up.pending_discards == 0


# ------------------------------------------------- deadline and losers, hedging off
@pytest.mark.asyncio
async def test_deadline_is_honoured_with_hedging_off() -> None:
    """Attempts that keep timing out are retried until the total deadline, not past it."""
    clock = FakeClock()
    store = MemoryBlobStore(["hang"] * 10, clock=clock)
    metrics = ServerMetrics()
    policy = replace(FAST, attempt_timeout_s=1.0, max_attempts=10, deadline_s=3.0)
    up = executor(store, policy, metrics=metrics)
    t0 = clock.time()
    with pytest.raises(
        TransientStorageError, match=r"missed its 3s deadline \(3 attempt\(s\), 2 failed"
    ) as info:
        await up.upload("job", DATA)
    assert info.value.retryable
    assert clock.time() - t0 == pytest.approx(3.0)
    assert len(store.put_keys) == 3  # at ~0 s, ~1 s and ~2 s; the third still ran at 3 s
    assert sample(metrics, "dstl_upload_deadline_exceeded_total") == 1
    assert sample(metrics, "dstl_upload_failures_total", kind="deadline") == 1
    assert sample(metrics, "dstl_uploads_total", result="failed") == 1
    assert sample(metrics, "dstl_hedges_started_total") == 0
    await up.close(10.0)
    assert sorted(store.deleted) == sorted(store.put_keys) and store.objects == {}


@pytest.mark.asyncio
async def test_attempt_that_lands_after_the_deadline_is_deleted() -> None:
    """Hedging off: the deadline fails the upload while its only attempt runs on; that
    attempt then completes (its object lands) and is deleted as a loser."""
    clock = FakeClock()
    store = MemoryBlobStore(plan=latencies(2.0), clock=clock)
    metrics = ServerMetrics()
    up = executor(store, replace(FAST, deadline_s=1.0), metrics=metrics)
    with pytest.raises(TransientStorageError, match=r"missed its 1s deadline .*1 still running"):
        await up.upload("job", DATA)
    (key,) = store.put_keys
    assert store.objects == {} and store.deleted == []  # still running
    await up.close(10.0)
    assert store.deleted == [key] and store.objects == {}
    assert clock.time() >= 1000.0 + 2.0  # deleted only once the put had ended
    assert sample(metrics, "dstl_upload_attempts_discarded_total") == 1


@pytest.mark.asyncio
async def test_failed_attempts_of_many_uploads_are_deleted_in_one_request() -> None:
    clock = FakeClock()
    store = MemoryBlobStore([TransientStorageError("503"), None] * 3, clock=clock)
    metrics = ServerMetrics()
    policy = replace(FAST, discard_batch_delay_s=5.0)
    up = executor(store, policy, metrics=metrics)
    keys = [await up.upload("job", DATA) for _ in range(3)]
    assert keys == store.put_keys[1::2]
    await clock.sleep(1.0)
    assert store.delete_calls == 0  # the batch is not due yet
    await clock.sleep(5.0)
    assert store.delete_calls == 1 and sorted(store.deleted) == sorted(store.put_keys[0::2])
    assert sample(metrics, "dstl_upload_attempts_discarded_total") == 3
    await up.close(1.0)
    assert store.delete_calls == 1


# --------------------------------------------------------- retry classification
class RetryableByType(StorageError):
    """A storage error class that is retryable whatever its message says."""

    kind = "retryable_by_type"
    retryable = True


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        (TimeoutError(), True),
        (TimeoutError("attempt timeout"), True),
        (TransientStorageError("403 in the message, but transient"), True),
        (StorageError("reset", retryable=True), True),
        (RetryableByType("x"), True),
        (StorageError("503 in the message, but not retryable"), False),
        (StorageError("x", retryable=False), False),
        (TransientStorageError("x", retryable=False), False),
        (BlobNotFound("no bucket"), False),
        (PermissionDenied("not yours"), False),
        (UploadFailed("not a storage error"), False),
        (ConnectionResetError("not wrapped by the store"), False),
        (RuntimeError("a bug"), False),
        (asyncio.CancelledError(), False),
    ],
)
def test_retry_classification_is_by_type(exc: BaseException, retryable: bool) -> None:
    assert is_retryable(exc) is retryable


@pytest.mark.asyncio
async def test_the_engine_retries_by_classification() -> None:
    up, store, metrics = uploader([RetryableByType("custom"), None])
    key = await up.upload("job", DATA)
    assert key == store.put_keys[1]
    assert sample(metrics, "dstl_upload_retries_total") == 1
    assert sample(metrics, "dstl_storage_failures_total", op="put", kind="retryable_by_type") == 1
    await up.close(1.0)
    up, store, _ = uploader([StorageError("x", retryable=False), None])
    with pytest.raises(StorageError, match=r"after 1 attempt\(s\)"):
        await up.upload("job", DATA)
    assert len(store.put_keys) == 1
    await up.close(1.0)
