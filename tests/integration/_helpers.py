"""Small helpers shared by the integration tests (real dstl-server processes)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client._status import to_dstl_error
from dstl_client._stream import error_of as stream_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import DstlError
from dstl_server.testing import ServerProcess

TMP_SUFFIX = ".tmp-dstl"


def poll_until(
    cond: Callable[[], bool], what: str, timeout_s: float = 15.0, interval_s: float = 0.02
) -> None:
    """Until ``cond()`` holds, failing with ``what`` after ``timeout_s``.

    For state of another process (a sidecar's metrics, the files it writes, a
    proxy's counters): no event crosses the process boundary, so this polls,
    bounded by a deadline. Within one process, await an event instead.
    """
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what} (not within {timeout_s:g}s)"
        time.sleep(interval_s)


def object_files(root: Path) -> list[Path]:
    """Every stored object (``*.dstl``) under a ServerProcess root, sorted."""
    return sorted((root / "objects").rglob("*.dstl"))


def temp_files(root: Path) -> list[Path]:
    """Leftover temp files of interrupted writes under a ServerProcess root."""
    return sorted(p for p in (root / "objects").rglob("*") if p.name.endswith(TMP_SUFFIX))


def object_path(root: Path, key: str) -> Path:
    return root / "objects" / key


def read_all(
    client: ChangelogClient, handle: ChangelogHandle, key_groups: list[int] | None = None
) -> list[tuple[int, int, bytes]]:
    return list(client.read_changes(handle, key_groups))


def raw_stub(address: str) -> tuple[grpc.Channel, pb_grpc.ChangelogStub]:
    """A bare gRPC stub that bypasses the client library's checks and buffering."""
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]


class Bystander:
    """Another job's writer whose data must survive whatever a test does to the sidecar.

    It persists one checkpoint on creation; ``assert_intact`` appends and
    persists more and checks every byte of both checkpoints reads back.
    """

    def __init__(self, client: ChangelogClient, job_id: str = "bystander") -> None:
        self.client = client
        self.writer: ChangelogWriter = client.create_writer(
            job_id=job_id, operator_id="op", key_group_range=(0, 7)
        )
        self.expected: list[tuple[int, bytes]] = []
        self._write(0)

    def _write(self, round_: int) -> ChangelogHandle:
        for kg in range(8):
            data = f"bystander-{round_}-{kg}".encode() * 3
            self.writer.append(kg, data)
            self.expected.append((kg, data))
        return self.writer.persist_durably(after=0).result(timeout=30)

    def assert_intact(self) -> None:
        handle = self._write(len(self.expected) // 8)
        got = sorted((kg, data) for kg, _sqn, data in read_all(self.client, handle))
        assert got == sorted(self.expected)


@dataclasses.dataclass
class Sidecar:
    """A sidecar process with a client, a bare stub (its own channel) and a bystander."""

    proc: ServerProcess
    root: Path
    client: ChangelogClient
    channel: grpc.Channel
    stub: pb_grpc.ChangelogStub
    bystander: Bystander


@contextlib.contextmanager
def sidecar_with_bystander(root: Path, extra_args: list[str]) -> Iterator[Sidecar]:
    """A :class:`Sidecar` on ``root``; its bystander writes job ``other-job``."""
    with ServerProcess(root, extra_args=extra_args) as proc:
        channel, stub = raw_stub(proc.address)
        client = ChangelogClient(proc.address, timeout_s=20)
        try:
            yield Sidecar(proc, root, client, channel, stub, Bystander(client, job_id="other-job"))
        finally:
            client.close()
            channel.close()


def on_stream(
    stub: pb_grpc.ChangelogStub, requests: list[pb.SessionRequest], timeout: float = 20
) -> tuple[list[pb.SessionResponse], DstlError | None]:
    """Send ``requests`` on one raw Session stream, half-close; every answer, in order
    of arrival, and the typed error the stream ended with (``None``: it ended OK)."""
    answers: list[pb.SessionResponse] = []
    try:
        for answer in stub.Session(iter(requests), timeout=timeout):
            answers.append(answer)
    except grpc.RpcError as exc:
        return answers, to_dstl_error(exc)
    return answers, None


#: the Session stream's field for each unary writer call
STREAM_FIELDS = {
    "Append": "append",
    "LastAppendedSqn": "last_appended_sqn",
    "PersistDurably": "persist",
    "Truncate": "truncate",
}


def refusal(stub: pb_grpc.ChangelogStub, transport: str, method: str, request: Any) -> DstlError:
    """The typed error ``request`` (of unary ``method``) gets, sent as ``transport`` says:
    a unary call, or the only request of a new Session stream (answered, not ended)."""
    if transport == "unary":
        return error_of(getattr(stub, method), request)
    answers, ended = on_stream(stub, [pb.SessionRequest(id=7, **{STREAM_FIELDS[method]: request})])
    assert ended is None, f"the stream ended with {ended!r} instead of answering"
    assert [a.id for a in answers] == [7] and answers[0].HasField("error"), answers
    return error_of_answer(answers[0])


def error_of_answer(answer: pb.SessionResponse) -> DstlError:
    """The typed error of a refused stream request (as the client raises it)."""
    assert answer.HasField("error"), f"request {answer.id} was not refused: {answer}"
    return stream_error(answer.error)


def error_of(call: Callable[..., Any], request: Any, timeout: float = 20) -> DstlError:
    """Send ``request`` through a bare stub; return the typed error it failed with."""
    try:
        result = call(request, timeout=timeout)
        if hasattr(result, "__next__"):  # server streaming
            list(result)
    except grpc.RpcError as exc:
        return to_dstl_error(exc)
    raise AssertionError(f"{type(request).__name__} was accepted")
