"""The sidecar's metrics: build info, process collectors and per-method gRPC metrics.

The gRPC interceptor is checked against a real in-process sidecar on loopback,
called by the real client (unary calls, the ``Session`` stream, the
``ReadChanges`` stream), a health check, a method that does not exist and a
call refused by the token check.
"""

from __future__ import annotations

import asyncio
import platform
from importlib.metadata import version
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from dstl_client.client import ChangelogClient
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_server.app import DstlServer
from dstl_server.metrics import ServerMetrics
from dstl_server.testing import running_server

CHANGELOG = "dstl.v1.Changelog"
SECRET = "q7Vx2LmP9rT4wZ8kN3bH6cJ1fD5sGa0y"


def sample(registry: CollectorRegistry, name: str, default: float = 0.0, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return default if value is None else value


def grpc_count(server: DstlServer, method: str, code: str = "OK") -> float:
    return sample(
        server.metrics.registry, "dstl_grpc_requests_total", method=f"{method}", code=code
    )


def grpc_seconds_count(server: DstlServer, method: str) -> float:
    return sample(server.metrics.registry, "dstl_grpc_request_seconds_count", method=method)


def test_build_info_and_process_metrics() -> None:
    r = ServerMetrics().registry
    assert (
        sample(
            r,
            "dstl_build_info",
            version=version("dstl"),
            python=platform.python_version(),
        )
        == 1
    )
    assert sample(r, "process_resident_memory_bytes") > 0
    assert sample(r, "process_cpu_seconds_total", default=-1) >= 0
    assert sample(r, "process_open_fds") > 0
    assert r.get_sample_value("python_info", None) is None  # it has labels:
    names = {s.name for family in r.collect() for s in family.samples}
    assert {"python_info", "python_gc_collections_total"} <= names


def test_two_sidecars_in_one_process_have_their_own_collectors() -> None:
    """Each ServerMetrics registers its own process collector: no duplicate error."""
    a, b = ServerMetrics(), ServerMetrics()
    assert sample(a.registry, "process_max_fds") == sample(b.registry, "process_max_fds") > 0


def _writer_round(address: str, transport: str) -> None:
    """Create a writer, append, persist, read the handle back, close: the client's way."""
    with ChangelogClient(address, transport=transport) as client:
        writer = client.create_writer(job_id="obs", operator_id="op", key_group_range=(0, 3))
        writer.append(1, b"hello")
        handle = writer.persist_durably(0).result(30)
        assert [data for _kg, _sqn, data in client.read_changes(handle)] == [b"hello"]
        writer.close()


@pytest.mark.asyncio
async def test_interceptor_counts_and_times_real_calls(server: DstlServer, transport: str) -> None:
    await asyncio.to_thread(_writer_round, server.address, transport)

    create = f"{CHANGELOG}/CreateWriter"
    assert grpc_count(server, create) == 1
    assert grpc_seconds_count(server, create) == 1
    # the server-streaming read: one call, counted when its stream ended
    read = f"{CHANGELOG}/ReadChanges"
    assert grpc_count(server, read) == 1
    assert grpc_seconds_count(server, read) == 1
    if transport == "stream":  # the writer's calls went on the client's Mux stream
        session = f"{CHANGELOG}/Mux"
        # counted once the stream ended (the client's close ends it)
        for _ in range(100):
            if grpc_seconds_count(server, session):
                break
            await asyncio.sleep(0.05)
        assert grpc_seconds_count(server, session) == 1
        assert sum(grpc_count(server, session, code) for code in ("OK", "CANCELLED")) == 1
    else:
        assert grpc_count(server, f"{CHANGELOG}/PersistDurably") == 1
    # nothing left running; the histogram has the call's duration
    r = server.metrics.registry
    assert sample(r, "dstl_grpc_requests_in_flight", method=create) == 0
    assert sample(r, "dstl_grpc_request_seconds_sum", method=create) > 0


@pytest.mark.asyncio
async def test_error_codes_health_and_unknown_methods(server: DstlServer) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stub.Append(pb.AppendRequest(log_id="0" * 32))
        code = failure.value.code().name
        assert grpc_count(server, f"{CHANGELOG}/Append", code) == 1
        assert code != "OK"

        health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert grpc_count(server, "grpc.health.v1.Health/Check") == 1

        # a name the client made up is not a label: it counts under "other"
        nope = channel.unary_unary(f"/{CHANGELOG}/NoSuchMethod")
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await nope(b"")
        assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert grpc_count(server, "other", "UNIMPLEMENTED") == 1
    methods = {
        s.labels["method"]
        for family in server.metrics.registry.collect()
        if family.name == "dstl_grpc_requests"
        for s in family.samples
    }
    assert not any("NoSuchMethod" in m for m in methods)


@pytest.mark.asyncio
async def test_refused_calls_are_counted_with_their_code(tmp_path: Path) -> None:
    async with (
        running_server(tmp_path, auth_secret=SECRET) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stub.CreateWriter(
                pb.CreateWriterRequest(job_id="obs", operator_id="op", last_key_group=1)
            )
        assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert grpc_count(server, f"{CHANGELOG}/CreateWriter", "UNAUTHENTICATED") == 1
