"""A shutdown whose grace runs out fails waiting persists with a typed error and exits non-zero."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dstl_client import ChangelogClient
from dstl_client.core.errors import ShuttingDown
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.s3fault import FaultProxyProcess
from tests.integration._helpers import poll_until

pytestmark = [pytest.mark.s3]

EXIT_ABANDONED = 3


@pytest.fixture
def proxy(weed_s3: SeaweedS3) -> Iterator[FaultProxyProcess]:
    with FaultProxyProcess(weed_s3.endpoint_url, seed=7) as p:
        yield p


def test_persists_cut_off_by_shutdown_get_shutting_down_and_exit_3(
    tmp_path_factory: pytest.TempPathFactory,
    weed_s3: SeaweedS3,
    proxy: FaultProxyProcess,
    s3_prefix: str,
) -> None:
    root = tmp_path_factory.mktemp("shutdown")
    args = [
        "--s3-endpoint-url",
        proxy.url,
        "--s3-region",
        weed_s3.region,
        "--hedge-mode",
        "off",
        "--upload-timeout-s",
        "60",
        "--upload-deadline-s",
        "60",
        "--shutdown-grace-s",
        "1",
    ]
    proc = ServerProcess(
        root, storage=weed_s3.storage_url(s3_prefix), extra_args=args, env=weed_s3.env()
    )
    with proc, ChangelogClient(proc.address, timeout_s=20) as client:
        w = client.create_writer(job_id="j", operator_id="op", key_group_range=(0, 3))
        puts = proxy.stats()["by_op"].get("PutObject", 0)
        proxy.set_faults({"latency": {"rate": 1.0, "dist": "fixed", "ms": 30_000}})
        w.append(1, b"never durable")
        fut = w.persist_durably(after=0)
        poll_until(  # the upload hangs now
            lambda: proxy.stats()["by_op"].get("PutObject", 0) > puts,
            "the upload reached the store",
            timeout_s=20,
        )
        code = proc.stop(timeout_s=20)
        with pytest.raises(ShuttingDown, match="grace"):
            fut.result(timeout=20)
        assert code == EXIT_ABANDONED
        assert "cut off 1 in-flight persist" in proc.stderr_path.read_text()
        proxy.set_faults({})
