"""Metrics, health, reflection and token auth of a real ``dstl-server`` process."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dstl_client import ChangelogClient
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import KeyGroupOutOfRange, SidecarUnavailable
from dstl_server.cli import main
from dstl_server.testing import ServerProcess
from tests.integration._helpers import object_files, read_all

SERVICE = "dstl.v1.Changelog"


def test_metrics_count_the_traffic(tmp_path: Path) -> None:
    root = tmp_path / "srv"
    with ServerProcess(root) as proc, ChangelogClient(proc.address) as client:
        before = proc.scrape_metrics()
        assert before["dstl_appended_bytes_total"] == 0
        writers = [
            client.create_writer(job_id="metrics", operator_id=f"op{i}", key_group_range=(0, 7))
            for i in range(3)
        ]
        changes = [(kg, bytes([kg]) * (10 * kg + 1)) for kg in range(8)] * 5
        for w in writers:
            w.append_many(changes)
        handles = [f.result(timeout=30) for f in [w.persist_durably(after=0) for w in writers]]
        for h in handles:
            assert len(read_all(client, h)) == len(changes)
        with pytest.raises(KeyGroupOutOfRange):
            # Bypass the client's own check so the sidecar counts the error.
            channel = grpc.insecure_channel(proc.address)
            try:
                stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
                stub.Append(
                    pb.AppendRequest(
                        log_id=writers[0].log_id,
                        changes=[
                            pb.KeyGroupChanges(
                                key_group=99, count=1, sizes=struct.pack("<I", 1), payload=b"x"
                            )
                        ],
                    ),
                    timeout=10,
                )
            except grpc.RpcError as exc:
                from dstl_client._status import to_dstl_error

                raise to_dstl_error(exc) from None
            finally:
                channel.close()
        writers[2].close()

        m = proc.scrape_metrics()
        appended_bytes = 3 * sum(len(d) + 4 for _, d in changes)
        assert m["dstl_appended_bytes_total"] == appended_bytes
        assert m["dstl_appended_changes_total"] == 3 * len(changes)
        assert m["dstl_append_requests_total"] >= 3
        assert m["dstl_persist_requests_total"] == 3
        assert m["dstl_persist_latency_seconds_count"] == 3
        assert m["dstl_persist_latency_seconds_sum"] > 0
        assert m["dstl_persist_failures_total"] == 0
        files = object_files(root)
        assert m['dstl_uploads_total{result="ok"}'] == len(files) >= 1
        assert m["dstl_upload_bytes_total"] == sum(p.stat().st_size for p in files)
        assert m["dstl_upload_logs_per_object_sum"] == 3
        assert m['dstl_upload_latency_seconds_count{size_class="lt256k"}'] == len(files)
        assert m["dstl_read_requests_total"] == 3
        assert m["dstl_read_bytes_total"] >= sum(h.stored_bytes for h in handles)
        assert m['dstl_errors_total{kind="key_group_out_of_range"}'] == 1
        assert m["dstl_writers"] == 2
        assert m["dstl_unuploaded_bytes"] == 0
        assert m["dstl_upload_in_flight_bytes"] == 0


def test_health_and_reflection(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv") as proc:
        channel = grpc.insecure_channel(proc.address)
        try:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", SERVICE):
                resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as unknown:
                health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

            refl = reflection_pb2_grpc.ServerReflectionStub(channel)
            (listing,) = refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
            names = {s.name for s in listing.list_services_response.service}
            assert {SERVICE, "grpc.health.v1.Health"} <= names
            (files,) = refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)]),
                timeout=10,
            )
            assert files.file_descriptor_response.file_descriptor_proto
        finally:
            channel.close()


def test_health_not_serving_on_sigterm_then_unavailable(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv", extra_args=["--shutdown-grace-s", "5"]) as proc:
        channel = grpc.insecure_channel(proc.address)
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=30)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            # A load balancer watching health learns the sidecar is going away.
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
            assert proc.stop(timeout_s=30) == 0
            with pytest.raises(grpc.RpcError) as gone:
                stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=2)
            assert gone.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            channel.close()
        with (
            ChangelogClient(proc.address, timeout_s=2) as client,
            pytest.raises(SidecarUnavailable),
        ):
            client.create_writer(job_id="gone", operator_id="op", key_group_range=(0, 0))


def test_non_loopback_listen_needs_tls_and_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = f"file://{tmp_path / 'objects'}"
    # One real process, the other addresses through the same ``main`` in-process.
    res = subprocess.run(
        [sys.executable, "-m", "dstl_server", "--listen", "0.0.0.0:0", "--storage", storage],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res
    assert "listen" in res.stderr and "needs TLS" in res.stderr
    for listen in ("192.0.2.10:7070", "[::]:7070", "example.com:7070"):
        assert main(["--listen", listen, "--storage", storage, "--print-config"]) == 2
        err = capsys.readouterr().err
        assert "setting listen=" in err and "needs TLS" in err
    # With TLS and a secret the same address is accepted (checked without binding it).
    secret = "Zr8q-test-secret-4Nw7xKp2Ld9sVb6Hc3"
    monkeypatch.setenv("DSTL_AUTH_SECRET", secret)
    tls = ["--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")]
    code = main(["--listen", "0.0.0.0:7070", "--storage", storage, *tls, "--print-config"])
    out = capsys.readouterr().out
    assert code == 0
    assert "listen = '0.0.0.0:7070'" in out
    assert "auth_secret = '***'" in out and secret not in out
    assert not (tmp_path / "objects").exists()
