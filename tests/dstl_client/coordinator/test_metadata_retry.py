"""The S3 metadata store's retry policy: one error table, jittered pauses, bounded and counted.

botocore's Stubber answers the HTTP calls; sleeps and the clock are injected
(the pauses are recorded, and the clock moves only by what was slept).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from dstl_client.coordinator.config import CheckpointSettings
from dstl_client.coordinator.metadata import MetadataStoreError, S3MetadataStore
from dstl_client.coordinator.metrics import CoordinatorMetrics
from dstl_client.core.errors import TransientStorageError
from dstl_client.core.s3_errors import TRANSIENT_CODES
from dstl_server.storage.s3_errors import map_s3_error


class Clocked:
    """A store whose sleeps advance a fake clock instead of waiting."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
        self.now = 0.0
        self.sleeps: list[float] = []
        self.store = S3MetadataStore(
            "bucket",
            "p",
            endpoint_url="http://127.0.0.1:9",
            region="us-east-1",
            sleep=self._sleep,
            clock=lambda: self.now,
            **kwargs,
        )
        self.stub = Stubber(self.store._client)
        self.stub.activate()

    def _sleep(self, seconds: float) -> None:
        self.sleeps.append(float(seconds))
        self.now += seconds

    def fail_puts(self, code: str, status: int, times: int) -> None:
        for _ in range(times):
            self.stub.add_client_error(
                "put_object", service_error_code=code, http_status_code=status
            )

    def close(self) -> None:
        self.stub.deactivate()
        self.store.close()


@pytest.fixture
def clocked(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clocked]:
    c = Clocked(monkeypatch, attempts=6, backoff_s=0.2, max_backoff_s=1.0, jitter_s=0.3)
    try:
        yield c
    finally:
        c.close()


def test_pauses_double_up_to_the_cap_with_jitter_and_are_counted(clocked: Clocked) -> None:
    clocked.fail_puts("SlowDown", 503, 6)
    with pytest.raises(MetadataStoreError, match="SlowDown") as e:
        clocked.store.put("a", b"x")
    assert e.value.retryable
    assert len(clocked.sleeps) == 5 and clocked.store.retries == 5
    for pause, base in zip(clocked.sleeps, (0.2, 0.4, 0.8, 1.0, 1.0), strict=True):
        assert base <= pause <= base + 0.3
    assert len(set(clocked.sleeps)) > 1  # jittered, not one fixed schedule
    clocked.stub.assert_no_pending_responses()
    # the driver's metric reads the store's count at each scrape
    metrics = CoordinatorMetrics("job-r")
    metrics.watch(CheckpointSettings, lambda: clocked.store.retries)
    sample = metrics.registry.get_sample_value
    assert sample("dstl_driver_metadata_retries_total", {"job_id": "job-r"}) == 5


def test_retrying_never_passes_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Clocked(
        monkeypatch, attempts=100, backoff_s=1.0, max_backoff_s=1.0, jitter_s=0.0, retry_limit_s=3.5
    )
    try:
        c.fail_puts("InternalError", 500, 4)
        with pytest.raises(MetadataStoreError, match="InternalError"):
            c.store.put("a", b"x")
        # three pauses of 1 s fit in 3.5 s, a fourth would end past it: not taken
        assert c.sleeps == [1.0, 1.0, 1.0] and c.store.retries == 3
        c.stub.assert_no_pending_responses()
    finally:
        c.close()


@pytest.mark.parametrize("code", sorted(TRANSIENT_CODES))
def test_the_driver_and_the_sidecar_retry_the_same_s3_codes(
    monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """One table: a 4xx-status answer with a transient code is retried by both."""
    error = ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")
    assert isinstance(map_s3_error(error, "put"), TransientStorageError)
    c = Clocked(monkeypatch, attempts=2, jitter_s=0.0)
    try:
        c.stub.add_client_error("put_object", service_error_code=code, http_status_code=400)
        c.stub.add_response("put_object", {})
        c.store.put("a", b"x")
        assert c.store.retries == 1
        c.stub.assert_no_pending_responses()
    finally:
        c.close()
