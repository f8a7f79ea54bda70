"""RetryingUploader against a scripted store: retries, timeouts, cleanup, metrics."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable

import pytest

from dstl_client.errors import (
    BlobNotFound,
    PermissionDenied,
    StorageError,
    TransientStorageError,
)
from dstl_server.metrics import ServerMetrics
from dstl_server.uploader import RetryingUploader, UploadPolicy
from tests.dstl_server._fakes import ScriptedStore, sample

DATA = b"an object" * 100
FAST = UploadPolicy(
    attempt_timeout_s=5.0, max_attempts=3, retry_base_delay_s=0.001, retry_max_delay_s=0.005
)


def uploader(
    script: Iterable[BaseException | str | None], policy: UploadPolicy = FAST
) -> tuple[RetryingUploader, ScriptedStore, ServerMetrics]:
    store = ScriptedStore(script)
    metrics = ServerMetrics()
    return RetryingUploader(store, policy, metrics), store, metrics


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


async def test_timed_out_attempt_is_retried_and_deleted() -> None:
    """A put that reached the store but never answered leaves an object: it is removed."""
    policy = UploadPolicy(
        attempt_timeout_s=0.05, max_attempts=3, retry_base_delay_s=0.001, retry_max_delay_s=0.005
    )
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


async def test_every_attempt_times_out() -> None:
    policy = UploadPolicy(
        attempt_timeout_s=0.02, max_attempts=2, retry_base_delay_s=0.001, retry_max_delay_s=0.005
    )
    up, store, metrics = uploader(["hang", "hang"], policy)
    with pytest.raises(TransientStorageError, match=r"timed out after 2 attempt\(s\)"):
        await up.upload("job", DATA)
    await up.close(1.0)
    assert store.objects == {}
    assert sample(metrics, "dstl_storage_failures_total", op="put", kind="timeout") == 2


async def test_failing_cleanup_does_not_fail_the_upload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class NoDeletes(ScriptedStore):
        async def delete(self, keys: object) -> int:
            raise TransientStorageError("delete refused")

    store = NoDeletes([TransientStorageError("503"), None])
    up = RetryingUploader(store, FAST, ServerMetrics())
    key = await up.upload("job", DATA)
    await up.close(1.0)  # the failed delete is logged, not raised
    assert store.objects == {key: DATA}
    assert f"could not delete failed attempt {store.put_keys[0]}" in caplog.text


async def test_close_is_bounded() -> None:
    class SlowDeletes(ScriptedStore):
        async def delete(self, keys: object) -> int:
            await asyncio.sleep(3600)
            return 0

    store = SlowDeletes([TransientStorageError("503"), None])
    up = RetryingUploader(store, FAST, ServerMetrics())
    await up.upload("job", DATA)
    started = time.monotonic()
    await up.close(0.05)
    assert time.monotonic() - started < 1.0
    stuck = list(up._cleanup)
    assert len(stuck) == 1
    for task in stuck:  # do not leave the stuck delete behind
        task.cancel()
    await asyncio.gather(*stuck, return_exceptions=True)
