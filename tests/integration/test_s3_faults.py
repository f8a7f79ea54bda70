"""A real ``dstl-server`` on S3 (SeaweedFS) behind the fault proxy.

* Acknowledged persists stay readable through 503s, connection resets, long
  delays and a kill -9 of the sidecar in the middle of an upload.
* A store that stays down: persists fail with a clear error within the
  upload deadline, memory stays bounded (backpressure), and the sidecar
  recovers when the store comes back.
* Hedged uploads delete their losers; after a clean shutdown the bucket holds
  exactly the objects acknowledged handles refer to.
"""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client.core.errors import Backpressure, DstlError, UploadFailed, WriterFailed
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.s3fault import FaultProxyProcess
from tests.integration._helpers import poll_until

pytestmark = [pytest.mark.s3, pytest.mark.slow]

MiB = 1 << 20
KG_RANGE = (0, 15)


@pytest.fixture
def proxy(weed_s3: SeaweedS3) -> Iterator[FaultProxyProcess]:
    with FaultProxyProcess(weed_s3.endpoint_url, seed=1234) as p:
        yield p


def sidecar(
    root: Path, s3: SeaweedS3, proxy: FaultProxyProcess, prefix: str, *args: str
) -> ServerProcess:
    """A dstl-server process storing in ``s3`` under ``prefix``, through ``proxy``."""
    return ServerProcess(
        root,
        storage=s3.storage_url(prefix),
        extra_args=["--s3-endpoint-url", proxy.url, "--s3-region", s3.region, *args],
        env=s3.env(),
    )


def bucket_keys(s3: SeaweedS3, prefix: str) -> set[str]:
    """Every object key under ``prefix/`` (straight from weed), prefix stripped."""
    client = s3.boto3_client()
    try:
        out: set[str] = set()
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=s3.bucket, Prefix=prefix + "/"
        ):
            out.update(obj["Key"][len(prefix) + 1 :] for obj in page.get("Contents", ()))
        return out
    finally:
        client.close()


@dataclass
class Acked:
    """A persist the sidecar acknowledged, and the changes its handle must give back."""

    handle: ChangelogHandle
    expected: list[tuple[int, bytes]]


@dataclass
class WriterRun:
    acked: list[Acked] = field(default_factory=list)
    failed_persists: int = 0


def checkpoint_rounds(
    writer: ChangelogWriter, rounds: int, seed: int, *, max_bytes: int = 16_000
) -> WriterRun:
    """``rounds`` checkpoints: append to a few key groups, persist, retry a failed persist."""
    rng = random.Random(seed)
    run = WriterRun()
    for r in range(rounds):
        boundary = writer.last_appended_sqn()
        expected = []
        for kg in rng.sample(range(KG_RANGE[0], KG_RANGE[1] + 1), 4):
            data = f"{writer.log_id}/{r}/{kg}/".encode() + rng.randbytes(rng.randint(1, max_bytes))
            writer.append(kg, data)
            expected.append((kg, data))
        for _ in range(5):
            try:
                handle = writer.persist_durably(after=boundary).result(timeout=60)
            except UploadFailed:
                run.failed_persists += 1  # the changes stay in the sidecar: persist again
                continue
            run.acked.append(Acked(handle, expected))
            break
        else:
            raise AssertionError(f"persist failed 5 times in a row: round {r}")
    return run


def run_writers(
    client: ChangelogClient, job: str, n: int, rounds: int, *, job_per_writer: bool = False
) -> list[WriterRun]:
    """``n`` writers checkpointing concurrently; in one job, or one job each (more objects)."""
    writers = [
        client.create_writer(
            job_id=f"{job}-{i}" if job_per_writer else job,
            operator_id=f"op{i}",
            key_group_range=KG_RANGE,
        )
        for i in range(n)
    ]
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        runs = list(
            pool.map(lambda iw: checkpoint_rounds(iw[1], rounds, iw[0]), enumerate(writers))
        )
    for w in writers:
        w.close()
    return runs


def assert_readable(client: ChangelogClient, acked: Sequence[Acked]) -> None:
    for a in acked:
        got = sorted((kg, data) for kg, _sqn, data in client.read_changes(a.handle))
        assert got == sorted(a.expected)


# --------------------------------------------------------------------------
def test_acknowledged_persists_survive_faults_and_a_kill(
    tmp_path: Path, weed_s3: SeaweedS3, proxy: FaultProxyProcess, s3_prefix: str
) -> None:
    proxy.set_faults(
        {
            "error_503_rate": 0.10,
            "reset_rate": 0.05,
            "latency": {"rate": 0.02, "dist": "fixed", "ms": 2000},
        }
    )
    args = (
        "--persist-delay-ms", "5",
        "--upload-timeout-s", "5",
        "--upload-deadline-s", "20",
        "--upload-max-attempts", "5",
        "--hedge-max-delay-ms", "500",
    )  # fmt: skip
    with (
        sidecar(tmp_path / "a", weed_s3, proxy, s3_prefix, *args) as proc,
        ChangelogClient(proc.address) as client,
    ):
        runs = run_writers(client, "faulty", n=8, rounds=30, job_per_writer=True)
        acked = [a for r in runs for a in r.acked]
        assert len(acked) == 8 * 30
        m = proc.scrape_metrics()
        st = proxy.stats()
        # the faults really happened and the sidecar really retried
        assert st["faults"]["503"] > 0 and st["faults"]["reset"] > 0
        assert st["faults"]["latency"] > 0
        assert m["dstl_upload_retries_total"] > 0

        # kill -9 while uploads hang in the proxy
        proxy.set_faults({"latency": {"rate": 1.0, "dist": "fixed", "ms": 3000}})
        w = client.create_writer(job_id="faulty-0", operator_id="victim", key_group_range=KG_RANGE)
        w.append(1, b"never acknowledged")
        future = w.persist_durably(after=0)
        poll_until(
            lambda: proxy.stats()["by_op"].get("PutObject", 0) > st["by_op"]["PutObject"],
            "the upload reached the store",
            timeout_s=10,
        )
        assert not future.done()
        proc.kill()
        with pytest.raises(DstlError):
            future.result(timeout=30)
    proxy.set_faults({})
    with (
        sidecar(tmp_path / "b", weed_s3, proxy, s3_prefix) as proc2,
        ChangelogClient(proc2.address) as client2,
    ):
        assert_readable(client2, acked)


def test_store_down_fails_within_deadline_bounds_memory_and_recovers(
    tmp_path: Path, weed_s3: SeaweedS3, proxy: FaultProxyProcess, s3_prefix: str
) -> None:
    limit = 8 * MiB
    args = (
        "--upload-timeout-s", "1",
        "--upload-deadline-s", "3",
        "--hedge-max-delay-ms", "300",
        "--max-in-flight-bytes", str(limit),
        "--batch-size-threshold", str(2 * MiB),
        "--preemptive-persist-threshold", str(2 * MiB),
        "--backpressure-timeout-s", "0.3",
    )  # fmt: skip
    with (
        sidecar(tmp_path, weed_s3, proxy, s3_prefix, *args) as proc,
        ChangelogClient(proc.address, batch_bytes=32 * MiB) as client,
    ):
        w = client.create_writer(job_id="down", operator_id="op", key_group_range=KG_RANGE)
        accepted: list[tuple[int, bytes]] = []

        def append(kg: int, data: bytes) -> None:
            w.append(kg, data)
            w.flush()  # one RPC per change, so we know which ones the sidecar took
            accepted.append((kg, data))

        append(0, b"before the outage")
        w.persist_durably(after=0).result(timeout=30)  # warm: S3 client and pool exist
        server = psutil.Process(proc.proc.pid)  # type: ignore[union-attr]
        rss_before = server.memory_info().rss

        # 1. The store hangs: every request stalls far longer than the deadline.
        proxy.set_faults({"latency": {"rate": 1.0, "dist": "fixed", "ms": 20_000}})
        append(1, b"while the store hangs")
        t0 = time.monotonic()
        with pytest.raises(UploadFailed, match=r"missed its 3s deadline") as info:
            w.persist_durably(after=0).result(timeout=30)
        took = time.monotonic() - t0
        assert 2.5 < took < 5.0, took
        assert "upload for job down failed" in info.value.message

        # 2. The store refuses everything (503): a clear error, well within the deadline.
        proxy.set_faults({"error_503_rate": 1.0})
        append(2, b"while the store refuses")
        t0 = time.monotonic()
        with pytest.raises(UploadFailed, match="SlowDown"):
            w.persist_durably(after=0).result(timeout=30)
        assert time.monotonic() - t0 < 3.5

        # 3. Keep appending while it is down: backpressure, not unbounded memory. A
        #    refused send fails its writer for good (WriterFailed), so the flood goes
        #    through fresh writers; the failed ones keep holding what they sent.
        rng = random.Random(5)
        flood = [client.create_writer(job_id="down", operator_id="flood", key_group_range=KG_RANGE)]

        def offer(n: int) -> int:
            pushed_back = 0
            for i in range(n):
                try:
                    flood[-1].append(i % 16, rng.randbytes(MiB // 2))
                    flood[-1].flush()
                except Backpressure:
                    pushed_back += 1
                    with pytest.raises(WriterFailed):  # sticky: never a silent gap
                        flood[-1].flush()
                    flood.append(
                        client.create_writer(
                            job_id="down", operator_id="flood", key_group_range=KG_RANGE
                        )
                    )
            return pushed_back

        assert offer(24) >= 4  # 12 MiB offered against an 8 MiB limit
        rss_1 = server.memory_info().rss
        assert offer(24) >= 20  # 12 MiB more: almost all pushed back
        rss_2 = server.memory_info().rss
        m = proc.scrape_metrics()
        assert m["dstl_unuploaded_bytes"] <= limit + MiB
        assert m["dstl_backpressure_waits_total"] >= 20
        assert m['dstl_upload_failures_total{kind="deadline"}'] >= 1
        assert m["dstl_upload_deadline_exceeded_total"] >= 1
        print(f"RSS MiB: before {rss_before / MiB:.0f}, {rss_1 / MiB:.0f}, {rss_2 / MiB:.0f}")
        assert rss_2 - rss_1 < 32 * MiB  # flat while pushed back
        assert rss_2 - rss_before < 160 * MiB

        # 4. The store comes back: everything accepted becomes durable and readable.
        proxy.set_faults({})
        handle = w.persist_durably(after=0).result(timeout=60)
        got = sorted((kg, data) for kg, _sqn, data in client.read_changes(handle))
        assert got == sorted(accepted)
        w.close()
        for f in flood:
            f.close()
        t0 = time.monotonic()
        assert proc.stop() == 0
        print(f"clean stop took {time.monotonic() - t0:.1f}s")


def test_hedge_losers_are_deleted_and_no_orphans_after_clean_shutdown(
    tmp_path: Path, weed_s3: SeaweedS3, proxy: FaultProxyProcess, s3_prefix: str
) -> None:
    # a fifth of the PUTs land 1.5 s late; hedge after 100 ms, no budget limit
    proxy.set_faults({"latency": {"rate": 0.2, "dist": "fixed", "ms": 1500}, "methods": ["PUT"]})
    args = (
        "--persist-delay-ms", "5",
        "--hedge-mode", "fixed",
        "--hedge-delay-ms", "100",
        "--hedge-budget-fraction", "1.0",
    )  # fmt: skip
    proc = sidecar(tmp_path, weed_s3, proxy, s3_prefix, *args)
    with proc, ChangelogClient(proc.address) as client:
        runs = run_writers(client, "hedged", n=4, rounds=10, job_per_writer=True)
        acked = [a for r in runs for a in r.acked]
        m = proc.scrape_metrics()
        # 40 uploads, a fifth of them slow: hedges start, and some win
        assert m["dstl_hedges_started_total"] >= 2
        assert m["dstl_hedges_won_total"] >= 1
        assert_readable(client, acked)
        referenced = {k for a in acked for k in a.handle.object_keys}
        assert proc.stop() == 0  # clean shutdown waits for the losers and deletes them
    assert bucket_keys(weed_s3, s3_prefix) == referenced
    # losers are deleted in batches: fewer requests than losers, but at least one
    assert 1 <= proxy.stats()["by_op"]["DeleteObjects"] <= m["dstl_hedges_started_total"]
