"""Idle Session streams are bounded: a cap on calls, and an unbound stream times out.

Before, 5,000 idle ``Session`` streams cost the sidecar +117 MiB with no limit.
Now ``max_concurrent_rpcs`` refuses calls past the cap with RESOURCE_EXHAUSTED,
and a stream whose first request never names a writer is closed after
``session_bind_timeout_s``; a stream bound to a writer stays open and works.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dstl_client import ChangelogClient
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_server.testing import ServerProcess
from tests.integration._helpers import poll_until

CAP = 8
SESSIONS_IN_FLIGHT = 'dstl_grpc_requests_in_flight{method="dstl.v1.Changelog/Session"}'
#: the client's writer stream (every writer of a client on one Mux stream)
MUX_IN_FLIGHT = 'dstl_grpc_requests_in_flight{method="dstl.v1.Changelog/Mux"}'


def idle_requests(stop: queue.SimpleQueue[None]) -> Iterator[pb.SessionRequest]:
    stop.get()  # sends nothing until the test ends
    return
    yield  # pragma: no cover - a generator


@pytest.mark.slow
def test_calls_past_the_cap_are_refused_and_unbound_streams_time_out(tmp_path: Path) -> None:
    args = ["--max-concurrent-rpcs", str(CAP), "--session-bind-timeout-s", "1.5"]
    stop: queue.SimpleQueue[None] = queue.SimpleQueue()
    with (
        ServerProcess(tmp_path, extra_args=args) as proc,
        ChangelogClient(proc.address) as client,
        grpc.insecure_channel(proc.address) as channel,
    ):
        w = client.create_writer(job_id="j", operator_id="op", key_group_range=(0, 3))
        w.append(0, b"bound")
        w.flush()  # the writer's stream is open and bound: one call of the cap
        stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
        idle = [stub.Session(idle_requests(stop)) for _ in range(CAP - 1)]
        try:
            poll_until(  # every idle stream reached the server (and the writer's)
                lambda: (
                    sum(
                        proc.scrape_metrics().get(m, 0) for m in (SESSIONS_IN_FLIGHT, MUX_IN_FLIGHT)
                    )
                    >= CAP
                ),
                "the idle streams open at the server",
            )
            with pytest.raises(grpc.RpcError) as info:
                next(stub.Session(idle_requests(stop), timeout=5))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # the unbound streams are closed after their timeout...
            for call in idle:
                with pytest.raises(grpc.RpcError) as ended:
                    next(call)
                assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert "session_bind_timeout_s" in (ended.value.details() or "")
            # ...which frees their slots, and the bound writer's stream still works
            w.append(1, b"still bound")
            handle = w.persist_durably(after=0).result(timeout=10)
            got = sorted(data for _kg, _sqn, data in client.read_changes(handle))
            assert got == [b"bound", b"still bound"]
            w2 = client.create_writer(job_id="j", operator_id="op2", key_group_range=(0, 3))
            w2.append(0, b"x")
            w2.flush()
        finally:
            for _ in range(CAP + 1):
                stop.put(None)
