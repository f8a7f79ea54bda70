"""One call on the wire: what the fuzzer knows of a writer, the call, its outcome.

Requests travel as bytes through ``channel.unary_unary(path,
request_serializer=None)`` (what ``ChangelogStub`` sends, minus the
serializer), so well-formed, crafted and garbage requests take one path.
A writer call marked ``stream`` travels instead as the only request of a
new ``Session`` stream (its bytes wrapped, unchanged, in a
``SessionRequest``), or, marked ``mux`` too, as the first request of the
only message of a new ``Mux`` stream, beside a request for a writer the
sidecar does not know (answered on its own); the stream's answer is turned
back into what the unary call would have returned (a response, or a code
and error kind).
:func:`invoke` and :func:`check_health` may be called from any thread with
that thread's own channel.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import ERROR_KIND_KEY
from loadtest.wire_fuzz.encoding import tag, varint
from loadtest.wire_fuzz.settings import (
    CALL_TIMEOUT_S,
    HEALTH_TIMEOUT_S,
    SERVICE,
)


@dataclass(slots=True)
class Writer:
    """What the fuzzer knows of one of its writers.

    Owned by the one worker thread that created it; no other thread reads it.
    """

    log_id: str
    job_id: str
    kg: tuple[int, int]
    ordered: bool
    session: int
    next_seq: int = 1
    #: an ordered writer whose every call so far reached the sidecar and was answered
    clean: bool = True
    boundary: int = 0
    #: the sidecar refuses its calls (failed, lost, closed): the worker closes and replaces it
    dead: bool = False
    #: a CloseWriter was sent (or the sidecar no longer knows it)
    closed: bool = False
    calls: int = 0
    history: deque[str] = field(default_factory=lambda: deque(maxlen=6))


@dataclass(slots=True)
class Call:
    """One request to send: the method, its bytes as they go on the wire, a description.

    Built by a generator and sent once, by the worker thread that built it.
    """

    method: str
    request: bytes
    desc: str
    writer: Writer | None = None
    #: the call takes the next turn of an ordered writer
    ordered: bool = False
    streaming: bool = False
    #: CreateWriter of a writer the worker keeps: (job, kg range, ordered, hoarder)
    pool: tuple[str, tuple[int, int], bool, bool] | None = None
    #: (session, seq) of a writer call
    order: tuple[int, int] | None = None
    #: ListObjects: the job listed (its next page token is kept for a later call)
    listing: str | None = None
    #: a writer call sent as the only request of a Session stream
    stream: bool = False
    #: ... of a Mux stream's only message instead (with a request of another writer)
    mux: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call ended: ``code`` is "OK" or the gRPC status name; ``kind`` the error kind.

    Frozen; made by :func:`invoke` on the thread that sent the call.
    """

    code: str
    kind: str | None
    details: str
    elapsed_s: float
    response: bytes | None = None
    responses: int = 0

    def summary(self) -> str:
        if self.code == "OK":
            return f"OK in {self.elapsed_s:.2f}s"
        kind = f"kind={self.kind}" if self.kind else "no dstl-error-kind"
        return f"{self.code} ({kind}) in {self.elapsed_s:.2f}s: {self.details[:300]}"


def invoke(channel: Any, call: Call, timeout_s: float = CALL_TIMEOUT_S) -> Outcome:
    """Send the call's bytes as they are; never raises for an RPC failure."""
    t0 = time.monotonic()
    path = SERVICE + call.method
    try:
        if call.stream:
            return _on_session(channel, call, timeout_s, t0)
        if call.streaming:
            stream = channel.unary_stream(
                path, request_serializer=None, response_deserializer=None
            )(call.request, timeout=timeout_s)
            n = 0
            for _ in stream:
                n += 1
            return Outcome("OK", None, "", time.monotonic() - t0, None, n)
        resp = channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
            call.request, timeout=timeout_s
        )
        return Outcome("OK", None, "", time.monotonic() - t0, bytes(resp), 1)
    except grpc.RpcError as exc:
        elapsed = time.monotonic() - t0
        kind = None
        try:
            for key, value in exc.trailing_metadata() or ():
                if key == ERROR_KIND_KEY:
                    kind = str(value)
        except Exception:
            pass
        try:
            code = str(exc.code().name)
            details = str(exc.details() or "")
        except Exception:
            code, details = "UNKNOWN", repr(exc)
        return Outcome(code, kind, details, elapsed)


#: SessionRequest field of each writer call
SESSION_FIELDS = {"Append": 2, "LastAppendedSqn": 3, "PersistDurably": 4, "Truncate": 5}
#: the request beside a fuzzed one on a Mux stream: a writer no sidecar knows
_MUX_NEIGHBOUR = pb.SessionRequest(
    id=2, last_appended_sqn=pb.LastAppendedSqnRequest(log_id="wire-fuzz-unknown-writer")
).SerializeToString()


def _on_session(channel: Any, call: Call, timeout_s: float, t0: float) -> Outcome:
    """One request on a new Session stream; its answer as the unary call's outcome."""
    # id 1, then the call's bytes as they are (length-delimited), then half-close
    raw = tag(1, 0) + varint(1) + tag(SESSION_FIELDS[call.method], 2)
    raw += varint(len(call.request)) + call.request
    if call.mux:  # MuxRequest.calls (field 1): the fuzzed request, then its neighbour
        raw = tag(1, 2) + varint(len(raw)) + raw
        raw += tag(1, 2) + varint(len(_MUX_NEIGHBOUR)) + _MUX_NEIGHBOUR
    stream = channel.stream_stream(
        SERVICE + ("Mux" if call.mux else "Session"),
        request_serializer=None,
        response_deserializer=None,
    )(iter([raw]), timeout=timeout_s)
    if call.mux:
        got = [a for m in stream for a in pb.MuxResponse.FromString(m).answers]
        neighbour = [a for a in got if a.id == 2]
        answers = [a for a in got if a.id != 2]
        if len(neighbour) != 1 or neighbour[0].error.kind != "log_not_found":
            elapsed = time.monotonic() - t0
            return Outcome("UNKNOWN", None, f"the neighbour was answered {neighbour}", elapsed)
    else:
        answers = [pb.SessionResponse.FromString(a) for a in stream]
    elapsed = time.monotonic() - t0
    if len(answers) != 1 or answers[0].id != 1:
        ids = [a.id for a in answers]
        return Outcome("UNKNOWN", None, f"stream answered ids {ids}, expected [1]", elapsed)
    answer = answers[0]
    if answer.HasField("error"):
        e = answer.error
        return Outcome(e.code or "UNKNOWN", e.kind or None, e.message, elapsed)
    unary: Any = {
        "Append": pb.AppendResponse(sqn=answer.sqn),
        "LastAppendedSqn": pb.SqnResponse(sqn=answer.sqn),
        "PersistDurably": pb.PersistResponse(handle=answer.handle),
        "Truncate": pb.TruncateResponse(),
    }[call.method]
    return Outcome("OK", None, "", elapsed, unary.SerializeToString(), 1)


def check_health(channel: Any) -> tuple[bool, str]:
    """(SERVING within HEALTH_TIMEOUT_S, what happened)."""
    stub = health_pb2_grpc.HealthStub(channel)
    t0 = time.monotonic()
    try:
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_TIMEOUT_S)
    except grpc.RpcError as exc:
        return False, f"health check failed after {time.monotonic() - t0:.2f}s: {exc.code().name}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return resp.status == health_pb2.HealthCheckResponse.SERVING, f"health {status}"
