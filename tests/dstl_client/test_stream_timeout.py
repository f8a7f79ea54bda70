"""MuxStream: a writer whose request gets no answer loses its call alone, unless the stream is dead.

A unit test of :class:`~dstl_client._stream.MuxStream` against a fake ``Mux``
server on loopback that answers the requests of some writers and holds the
others' (the real sidecar answers every request; a hung request of one
writer is what this class must survive without failing its siblings).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from dstl_client._mux_leg import MuxLane
from dstl_client._stream import MuxStream
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import SidecarUnavailable
from dstl_client.transport import Connection

TIMEOUT_S = 1.0


class FakeMux:
    """A ``Mux`` rpc that answers the writers in ``answered`` at once and holds the rest
    until ``release`` is set (then answers them too). ``calls``: gRPC calls opened."""

    def __init__(self, answered: set[str]) -> None:
        self.answered = answered
        self.release = threading.Event()
        self.calls = 0
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.stream_stream_rpc_method_handler(
            self._mux,
            request_deserializer=pb.MuxRequest.FromString,
            response_serializer=pb.MuxResponse.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("dstl.v1.Changelog", {"Mux": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _mux(
        self, requests: Iterator[pb.MuxRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.MuxResponse]:
        with self._lock:
            self.calls += 1
        held: list[int] = []
        for message in requests:
            answers = []
            for call in message.calls:
                if call.last_appended_sqn.log_id in self.answered or self.release.is_set():
                    answers.append(pb.SessionResponse(id=call.id, sqn=7))
                else:
                    held.append(call.id)
            if self.release.is_set():  # the held requests, late
                answers += [pb.SessionResponse(id=i, sqn=7) for i in held]
                held.clear()
            if answers:
                yield pb.MuxResponse(answers=answers)

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def fake() -> Iterator[FakeMux]:
    f = FakeMux(answered={"A"})
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def stream(fake: FakeMux) -> Iterator[MuxStream]:
    conn = Connection(
        f"127.0.0.1:{fake.port}",
        token=None,
        root_certificates=None,
        timeout_s=TIMEOUT_S,
        max_message_bytes=4 << 20,
    )
    s = MuxStream(conn)
    try:
        yield s
    finally:
        s.cancel()
        conn.close()


def sqn_of(stream: MuxStream, lane: MuxLane) -> int:
    request = pb.SessionRequest()
    request.last_appended_sqn.log_id = lane.log_id
    return int(stream.call(lane, request, TIMEOUT_S).sqn)


def test_a_writer_without_an_answer_loses_its_call_alone(fake: FakeMux, stream: MuxStream) -> None:
    a, b = MuxLane("A"), MuxLane("B")
    assert sqn_of(stream, a) == 7
    done = threading.Event()
    answered_meanwhile = 0

    def keep_a_busy() -> None:  # the stream answers A while B waits (bounded)
        nonlocal answered_meanwhile
        for _ in range(200):
            if done.wait(0.05):
                return
            answered_meanwhile += sqn_of(stream, a) == 7

    busy = threading.Thread(target=keep_a_busy)
    busy.start()
    try:
        with pytest.raises(SidecarUnavailable, match="answered others"):
            sqn_of(stream, b)
    finally:
        done.set()
        busy.join(10)
    assert answered_meanwhile > 0
    # A goes on on the same gRPC call, also once B's late answer arrives (dropped)
    fake.release.set()
    for _ in range(3):
        assert sqn_of(stream, a) == 7
    assert fake.calls == 1


def test_a_stream_that_answers_nothing_is_cancelled_and_reopened(
    fake: FakeMux, stream: MuxStream
) -> None:
    b = MuxLane("B")
    with pytest.raises(SidecarUnavailable, match="no answer on the writer stream"):
        sqn_of(stream, b)
    fake.release.set()
    assert sqn_of(stream, MuxLane("A")) == 7  # on a new gRPC call
    assert fake.calls == 2
