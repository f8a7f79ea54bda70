"""Store housekeeping of a real ``dstl-server`` process.

* Temp files of writes interrupted by a crash are removed when the next
  process starts (before it reports READY), counted and logged; they are
  never read as objects.
* Health follows the store: a sidecar whose store does not answer reports
  its Changelog service (``dstl.v1.Changelog``, what readiness probes ask)
  NOT_SERVING (``READY ... store=down`` is printed: the process is up, the
  store is not), turns it SERVING when the store answers and NOT_SERVING
  again while the store fails. The overall health (``""``, what startup and
  liveness probes ask) stays SERVING: restarting the sidecar would not bring
  the store back, and it would drop the changes it holds.
* A store that refuses the sidecar at start (no such bucket, credentials it
  does not accept) is a configuration error: exit 2, one line on stderr.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dstl_client import ChangelogClient
from dstl_client.core.errors import DstlError
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.s3fault import FaultProxyProcess
from tests.integration._helpers import (
    TMP_SUFFIX,
    object_files,
    poll_until,
    read_all,
    temp_files,
)

SERVICE = "dstl.v1.Changelog"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def health_stub(address: str) -> Iterator[health_pb2_grpc.HealthStub]:
    channel = grpc.insecure_channel(address)
    try:
        yield health_pb2_grpc.HealthStub(channel)
    finally:
        channel.close()


def status(stub: health_pb2_grpc.HealthStub, service: str = SERVICE) -> int:
    """The health of the Changelog service (readiness), or of the process with ``""``."""
    resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return int(resp.status)


def wait_for_status(stub: health_pb2_grpc.HealthStub, want: int, timeout_s: float = 60) -> None:
    """Watch the Changelog service's health until it reports ``want``."""
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout_s)
    try:
        for resp in watch:
            if resp.status == want:
                break
    finally:
        watch.cancel()
    assert status(stub) == want
    assert status(stub, "") == SERVING  # liveness is not the store's business


def log_lines(proc: ServerProcess, skip: int = 0) -> list[str]:
    """The messages the process logged (JSON lines on stderr), after the first ``skip`` lines
    of its stderr file (processes on one root append to the same file)."""
    out = []
    for line in proc.stderr_path.read_text().splitlines()[skip:]:
        try:
            out.append(json.loads(line)["msg"])
        except (ValueError, KeyError):
            continue
    return out


# --------------------------------------------------- leftovers of killed writes
def _has_objects(root: Path, n: int) -> bool:
    return len(object_files(root)) >= n


def _write_until_killed(address: str, job: str, stop: threading.Event) -> None:
    """Persist ~1 MiB checkpoints in a loop until the sidecar dies under it."""
    try:
        with ChangelogClient(address, timeout_s=10) as client:
            writer = client.create_writer(job_id=job, operator_id="op", key_group_range=(0, 7))
            i = 0
            while not stop.is_set():
                for kg in range(8):
                    writer.append(kg, bytes([i % 256, kg]) * 64 * 1024)
                writer.persist_durably(after=0).result(timeout=30)
                i += 1
    except DstlError:
        pass  # the sidecar was killed: expected


@pytest.mark.slow
def test_restart_removes_temp_files_of_killed_writes(tmp_path: Path) -> None:
    root = tmp_path / "srv"
    objects = root / "objects"
    planted: list[Path] = []
    for round_ in range(3):
        with ServerProcess(root) as proc:
            # whatever the previous round left behind is gone before READY
            assert temp_files(root) == []
            stop = threading.Event()
            writer = threading.Thread(
                target=_write_until_killed, args=(proc.address, f"job-{round_}", stop)
            )
            writer.start()
            poll_until(
                functools.partial(_has_objects, root, 2 * (round_ + 1)),
                "the sidecar stored objects",
                timeout_s=30,
                interval_s=0.01,
            )
            # A write cut between its temp file and its rename, as a kill leaves it
            # (a kill during the writes above may leave more of them).
            planted.append(
                objects / f"job-{round_}" / "00" / f".obj.dstl.0123abc{round_}{TMP_SUFFIX}"
            )
            planted[-1].parent.mkdir(parents=True, exist_ok=True)
            planted[-1].write_bytes(b"half an object" * 1000)
            proc.kill()
            stop.set()
            writer.join(60)
            assert not writer.is_alive()
            assert planted[-1].exists()
    left = temp_files(root)
    assert planted[-1] in left
    logged_before = len((root / "server.stderr").read_text().splitlines())
    with ServerProcess(root) as proc:
        assert temp_files(root) == []
        m = proc.scrape_metrics()
        assert m["dstl_leftover_temp_files_removed_total"] == len(left)
        assert m["dstl_store_up"] == 1
        removed = [line for line in log_lines(proc, logged_before) if "leftover" in line]
        assert len(removed) == 1 and str(len(left)) in removed[0]
        with health_stub(proc.address) as stub:
            assert status(stub) == status(stub, "") == SERVING
        # the store still works, and only complete objects were ever listed or read
        with ChangelogClient(proc.address) as client:
            w = client.create_writer(job_id="after", operator_id="op", key_group_range=(0, 0))
            w.append(0, b"after the crashes")
            h = w.persist_durably(after=0).result(timeout=30)
            assert read_all(client, h) == [(0, 0, b"after the crashes")]
    assert temp_files(root) == []


# ------------------------------------------------------- health follows the store
def _s3_sidecar(
    root: Path,
    storage: str,
    endpoint: str,
    env: dict[str, str],
    region: str = "us-east-1",
    *extra_args: str,
) -> ServerProcess:
    return ServerProcess(
        root,
        storage=storage,
        extra_args=["--s3-endpoint-url", endpoint, "--s3-region", region, *extra_args],
        env=env,
    )


def _start_refused(storage: str, weed_s3: SeaweedS3, env: dict[str, str]) -> str:
    """Start dstl-server against ``weed_s3``; it must exit 2 by itself: its one stderr line."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dstl_server",
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "-1",
            "--storage",
            storage,
            *weed_s3.server_args(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stdout == ""  # never READY
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"dstl-server: configuration error: setting storage={storage!r}: ")
    return line


@pytest.mark.s3
def test_missing_bucket_exits_2_at_start(weed_s3: SeaweedS3) -> None:
    line = _start_refused("s3://no-such-bucket-here/prefix", weed_s3, weed_s3.env())
    assert "NoSuchBucket" in line


@pytest.mark.s3
def test_refused_credentials_exit_2_at_start(weed_s3: SeaweedS3, s3_prefix: str) -> None:
    env = {**weed_s3.env(), "AWS_SECRET_ACCESS_KEY": "not-the-secret-key"}
    line = _start_refused(weed_s3.storage_url(s3_prefix), weed_s3, env)
    assert "SignatureDoesNotMatch" in line or "AccessDenied" in line or "InvalidAccess" in line


@pytest.mark.slow
def test_unreachable_s3_at_start_is_not_serving(tmp_path: Path) -> None:
    """Nothing listens at the endpoint: the process starts, health says NOT_SERVING."""
    port = _free_port()
    env = {
        "AWS_ACCESS_KEY_ID": "dummy",
        "AWS_SECRET_ACCESS_KEY": "dummy",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with (
        _s3_sidecar(
            tmp_path / "srv", "s3://bucket/prefix", f"http://127.0.0.1:{port}", env
        ) as proc,
        health_stub(proc.address) as stub,
    ):
        assert not proc.store_up  # READY ... store=down
        assert status(stub) == NOT_SERVING
        assert status(stub, "") == SERVING
        m = proc.scrape_metrics()
        assert m["dstl_store_up"] == 0
        assert m["dstl_store_probe_failures_total"] >= 1
        assert any(f"127.0.0.1:{port}" in line for line in log_lines(proc))


@pytest.mark.s3
def test_health_follows_the_s3_store(tmp_path: Path, weed_s3: SeaweedS3, s3_prefix: str) -> None:
    """Down at start, SERVING once the endpoint answers, NOT_SERVING while it fails.

    Each change shows within one probe interval (``--store-probe-interval-s``, 0.5 s here).
    """
    port = _free_port()
    with (
        _s3_sidecar(
            tmp_path / "srv",
            weed_s3.storage_url(s3_prefix),
            f"http://127.0.0.1:{port}",
            weed_s3.env(),
            weed_s3.region,
            "--store-probe-interval-s",
            "0.5",
        ) as proc,
        health_stub(proc.address) as stub,
    ):
        assert not proc.store_up
        assert status(stub) == NOT_SERVING
        # the store appears at the configured endpoint
        with FaultProxyProcess(weed_s3.endpoint_url, listen=f"127.0.0.1:{port}") as proxy:
            wait_for_status(stub, SERVING)
            assert proc.scrape_metrics()["dstl_store_up"] == 1
            with ChangelogClient(proc.address) as client:
                w = client.create_writer(job_id="up", operator_id="op", key_group_range=(0, 0))
                w.append(0, b"stored in s3")
                h = w.persist_durably(after=0).result(timeout=60)
                assert read_all(client, h) == [(0, 0, b"stored in s3")]
            # the store fails every request: health turns NOT_SERVING
            proxy.set_faults({"error_503_rate": 1.0})
            wait_for_status(stub, NOT_SERVING)
            m = proc.scrape_metrics()
            assert m["dstl_store_up"] == 0
            assert m["dstl_store_probe_failures_total"] >= 2  # at start, and now
