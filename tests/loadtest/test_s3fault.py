"""The S3 fault proxy between an S3BlobStore and a real SeaweedFS server (SigV4 enforced)."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from dstl_client.core.errors import BlobNotFound, StorageError, TransientStorageError
from dstl_server.storage.s3 import S3BlobStore
from dstl_server.testing_s3 import SeaweedS3
from loadtest.s3fault import (
    FaultConfig,
    FaultConfigError,
    FaultProxyProcess,
    LatencySpec,
    S3FaultProxy,
    s3_operation,
)
from tests.s3_fixtures import store_for

pytestmark = pytest.mark.s3


@pytest_asyncio.fixture
async def proxy(weed_s3: SeaweedS3) -> AsyncIterator[S3FaultProxy]:
    async with S3FaultProxy(weed_s3.endpoint_url, seed=7) as p:
        yield p


@pytest_asyncio.fixture
async def store(
    weed_s3: SeaweedS3, proxy: S3FaultProxy, s3_prefix: str
) -> AsyncIterator[S3BlobStore]:
    s = store_for(weed_s3, s3_prefix, endpoint_url=proxy.url)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def direct(s3_store: S3BlobStore) -> S3BlobStore:
    """The same prefix, straight to weed (to see what really landed)."""
    return s3_store


async def keys(store: S3BlobStore) -> list[str]:
    return [b.key async for b in store.list()]


# ---------------------------------------------------------------- forwarding
@pytest.mark.asyncio
async def test_forwards_every_operation_unchanged(
    store: S3BlobStore, direct: S3BlobStore, proxy: S3FaultProxy
) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: botocore sends Expect: 100-continue
    await store.put("j/aa/one", data)
    await store.put("j/bb/two", b"small")
    assert await direct.get("j/aa/one") == data  # byte for byte upstream
    assert await store.get("j/aa/one") == data
    assert await store.get("j/aa/one", 1000, 10) == data[1000:1010]
    assert await store.get("j/aa/one", 0, 0) == b""  # HEAD through the proxy
    with pytest.raises(BlobNotFound):
        await store.get("j/none")
    assert await keys(store) == ["j/aa/one", "j/bb/two"]
    await store.delete(["j/aa/one", "j/bb/two"])
    assert await keys(direct) == []
    st = proxy.stats.snapshot()
    assert st["by_op"]["PutObject"] == 2 and st["by_op"]["DeleteObjects"] == 1
    assert st["forwarded"] == st["requests"] and st["upstream_errors"] == 0
    assert sum(st["faults"].values()) == 0


@pytest.mark.asyncio
async def test_signatures_still_checked_through_the_proxy(
    weed_s3: SeaweedS3, proxy: S3FaultProxy, s3_prefix: str
) -> None:
    bad = store_for(weed_s3, s3_prefix, endpoint_url=proxy.url, aws_secret_access_key="wrong")
    try:
        with pytest.raises(StorageError, match="SignatureDoesNotMatch") as info:
            await bad.put("j/aa/x", b"data")
        assert not info.value.retryable
    finally:
        await bad.close()


# -------------------------------------------------------------------- faults
@pytest.mark.asyncio
async def test_503_and_500_answers_for_selected_methods(
    store: S3BlobStore, direct: S3BlobStore, proxy: S3FaultProxy
) -> None:
    await store.put("j/aa/kept", b"kept")
    proxy.set_faults({"error_503_rate": 1.0, "methods": ["put"]})
    with pytest.raises(TransientStorageError, match="SlowDown"):
        await store.put("j/aa/x", b"data")
    assert await store.get("j/aa/kept") == b"kept"  # GET is not selected
    proxy.set_faults(FaultConfig(error_500_rate=1.0))
    with pytest.raises(TransientStorageError, match="InternalError"):
        await store.get("j/aa/kept")
    proxy.set_faults({})
    assert await keys(direct) == ["j/aa/kept"]  # the failed PUT never reached weed
    st = proxy.stats.snapshot()
    assert st["faults"]["503"] == 1 and st["faults"]["500"] == 1
    assert st["faults_by_op"] == {"PutObject:503": 1, "GetObject:500": 1}


@pytest.mark.asyncio
async def test_connection_reset_before_and_after_forwarding(
    store: S3BlobStore, direct: S3BlobStore, proxy: S3FaultProxy
) -> None:
    proxy.set_faults({"reset_rate": 1.0, "methods": ["PUT"]})
    with pytest.raises(TransientStorageError):
        await store.put("j/aa/before", b"data")
    assert await keys(direct) == []
    # After forwarding: the object landed but the client only saw a reset.
    proxy.set_faults({"reset_rate": 1.0, "reset_phase": "response", "methods": ["PUT"]})
    with pytest.raises(TransientStorageError):
        await store.put("j/aa/after", b"data")
    assert await keys(direct) == ["j/aa/after"]
    assert proxy.stats.snapshot()["faults"]["reset"] >= 2


@pytest.mark.asyncio
async def test_latency_is_added_to_selected_requests(
    store: S3BlobStore, proxy: S3FaultProxy
) -> None:
    await store.put("j/aa/x", b"data")
    proxy.set_faults(
        {
            "latency": {"rate": 1.0, "dist": "uniform", "min_ms": 300, "max_ms": 400},
            "methods": ["PUT"],
        }
    )
    t0 = time.perf_counter()
    await store.put("j/aa/y", b"data")
    slow = time.perf_counter() - t0
    t0 = time.perf_counter()
    await store.get("j/aa/x")
    fast = time.perf_counter() - t0
    assert 0.3 <= slow < 2.0
    assert fast < 0.25
    assert proxy.stats.snapshot()["faults"]["latency"] == 1


@pytest.mark.asyncio
async def test_fault_rates_are_applied_per_request(store: S3BlobStore, proxy: S3FaultProxy) -> None:
    proxy.set_faults({"error_503_rate": 0.3, "methods": ["PUT"]})
    failures = 0
    for i in range(150):
        try:
            await store.put(f"j/aa/{i}", b"d")
        except TransientStorageError:
            failures += 1
    injected = proxy.stats.snapshot()["faults"]["503"]
    assert failures == injected  # every injected 503 reached the client, nothing else failed
    assert 20 <= injected <= 70  # 45 expected; binomial sd ~5.6


# ------------------------------------------------------ as a separate process
def test_process_with_live_fault_changes(weed_s3: SeaweedS3, s3_prefix: str) -> None:
    with FaultProxyProcess(weed_s3.endpoint_url, faults={"error_503_rate": 1.0}) as proxy:
        assert proxy.faults()["error_503_rate"] == 1.0

        async def put() -> str:
            store = store_for(weed_s3, s3_prefix, endpoint_url=proxy.url)
            try:
                await store.put("j/aa/x", b"data")
                return "ok"
            except TransientStorageError as exc:
                return exc.message
            finally:
                await store.close()

        assert "SlowDown" in asyncio.run(put())
        got = proxy.set_faults({"latency": {"rate": 0.5, "dist": "fixed", "ms": 1}})
        assert got["error_503_rate"] == 0.0 and got["latency"]["ms"] == 1
        assert asyncio.run(put()) == "ok"
        st = proxy.stats()
        assert st["by_op"]["PutObject"] == 2 and st["faults"]["503"] == 1
        assert proxy.reset_stats()["requests"] == 0
        # a bad configuration is refused and the old one stays
        req = urllib.request.Request(
            proxy.url + "/__fault__", data=json.dumps({"error_503_rate": 2}).encode(), method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        info.value.close()  # the error response holds the connection's socket
        assert info.value.code == 400
        assert proxy.faults()["latency"]["rate"] == 0.5
    assert proxy.proc is not None and proxy.proc.poll() is not None


# ---------------------------------------------------------- configuration
def test_config_validation() -> None:
    with pytest.raises(FaultConfigError, match="unknown"):
        FaultConfig.from_dict({"error_503": 0.1})
    with pytest.raises(FaultConfigError, match="> 1"):
        FaultConfig.from_dict({"error_503_rate": 0.6, "reset_rate": 0.6})
    with pytest.raises(FaultConfigError, match="between 0 and 1"):
        FaultConfig.from_dict({"reset_rate": -0.1})
    with pytest.raises(FaultConfigError, match="dist"):
        FaultConfig.from_dict({"latency": {"rate": 0.1, "dist": "normal"}})
    with pytest.raises(FaultConfigError, match="phase"):
        FaultConfig.from_dict({"reset_phase": "later"})
    cfg = FaultConfig.from_dict({"methods": ["put"], "latency": {"rate": 0.02, "ms": 5}})
    assert FaultConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.applies_to("PUT") and not cfg.applies_to("GET")


def test_latency_distributions() -> None:
    rng = random.Random(1)
    assert LatencySpec(dist="fixed", ms=12).draw_ms(rng) == 12
    u = [LatencySpec(dist="uniform", min_ms=1000, max_ms=2000).draw_ms(rng) for _ in range(500)]
    assert min(u) >= 1000 and max(u) <= 2000
    logn = sorted(
        LatencySpec(dist="lognormal", median_ms=50, sigma=1.0).draw_ms(rng) for _ in range(2001)
    )
    assert 40 < logn[1000] < 60  # the median
    par = [
        LatencySpec(dist="pareto", min_ms=10, alpha=1.2, max_ms=500).draw_ms(rng)
        for _ in range(2000)
    ]
    assert min(par) >= 10 and max(par) == 500  # heavy tail, capped


def test_operation_names() -> None:
    assert s3_operation("POST", {"delete": ""}) == "DeleteObjects"
    assert s3_operation("GET", {"list-type": "2"}) == "ListObjects"
    assert s3_operation("PUT", {}) == "PutObject"
    assert s3_operation("PUT", {"partNumber": "1", "uploadId": "x"}) == "UploadPart"
