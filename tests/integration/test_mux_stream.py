"""The Mux stream: every writer of a client on one stream, messages carrying several writers.

Against a real sidecar process: requests of several writers in one message
are each applied in their writer's order; persists begun together are
answered in one message; one writer's refusal (and its sticky failure)
leaves its siblings on the stream untouched; the client opens one stream
for all its writers. (The contract suites run every writer test on this
stream too: the ``transport`` fixture's ``"stream"``.)
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import grpc
import pytest

from dstl_client import ChangelogClient, ChangelogHandle
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    ConfigError,
    InvalidArgument,
    KeyGroupOutOfRange,
    WriterFailed,
)
from dstl_server.testing import ServerProcess
from tests.integration._helpers import error_of_answer, raw_stub, read_all

MUX = "dstl.v1.Changelog/Mux"


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("mux")
    with ServerProcess(root, extra_args=["--persist-delay-ms", "10"]) as p:
        yield p


@pytest.fixture
def client(proc: ServerProcess) -> Iterator[ChangelogClient]:
    with ChangelogClient(proc.address, timeout_s=20) as c:
        yield c


def part(key_group: int, data: bytes) -> pb.KeyGroupChanges:
    return pb.KeyGroupChanges(
        key_group=key_group, count=1, sizes=len(data).to_bytes(4, "little"), payload=data
    )


def mux(proc: ServerProcess, messages: list[pb.MuxRequest]) -> list[pb.MuxResponse]:
    """Send ``messages`` on one raw Mux stream, half-close; every answer message."""
    channel, stub = raw_stub(proc.address)
    try:
        return list(stub.Mux(iter(messages), timeout=20))
    finally:
        channel.close()


def test_persists_of_one_message_are_answered_together(
    proc: ServerProcess, client: ChangelogClient
) -> None:
    """Eight writers' persists in one message: one flush, answered in one message; each
    handle holds its own writer's change."""
    writers = [
        client.create_writer(job_id="mux", operator_id=f"op{i}", key_group_range=(0, 3))
        for i in range(8)
    ]
    message = pb.MuxRequest(
        calls=[
            pb.SessionRequest(
                id=i + 1,
                persist=pb.PersistRequest(log_id=w.log_id, after=0, changes=[part(2, b"w%d" % i)]),
            )
            for i, w in enumerate(writers)
        ]
    )
    answers = mux(proc, [message])
    assert len(answers) == 1, f"answered in {len(answers)} messages"
    got = {a.id: a for a in answers[0].answers}
    assert sorted(got) == list(range(1, 9))
    for i, w in enumerate(writers):
        handle = ChangelogHandle.from_proto(got[i + 1].handle)
        assert handle.log_id == w.log_id
        assert [d for _, _, d in read_all(client, handle)] == [b"w%d" % i]
    for w in writers:
        w.close()
    metrics = proc.scrape_metrics()
    assert metrics['dstl_stream_requests_per_message_sum{direction="in"}'] >= 8
    assert metrics["dstl_stream_persists_per_message_sum"] >= 8


def test_one_writers_failure_leaves_its_siblings_alone(
    proc: ServerProcess, client: ChangelogClient
) -> None:
    """Writer A's append is refused (a key group outside its range, carrying changes):
    A's later requests are refused (writer_failed) while B, in the same messages, goes
    on; a request that names no writer is refused alone."""
    a = client.create_writer(job_id="mux", operator_id="a", key_group_range=(0, 3))
    b = client.create_writer(job_id="mux", operator_id="b", key_group_range=(4, 7))
    first = pb.MuxRequest(
        calls=[
            pb.SessionRequest(
                id=1, append=pb.AppendRequest(log_id=a.log_id, changes=[part(9, b"x")])
            ),
            pb.SessionRequest(
                id=2, append=pb.AppendRequest(log_id=b.log_id, changes=[part(5, b"b1")])
            ),
            pb.SessionRequest(id=3, last_appended_sqn=pb.LastAppendedSqnRequest()),
        ]
    )
    second = pb.MuxRequest(
        calls=[
            pb.SessionRequest(id=4, persist=pb.PersistRequest(log_id=a.log_id, after=0)),
            pb.SessionRequest(
                id=5, persist=pb.PersistRequest(log_id=b.log_id, after=0, changes=[part(6, b"b2")])
            ),
        ]
    )
    got = {ans.id: ans for m in mux(proc, [first, second]) for ans in m.answers}
    assert sorted(got) == [1, 2, 3, 4, 5]
    assert isinstance(error_of_answer(got[1]), KeyGroupOutOfRange)
    assert isinstance(error_of_answer(got[3]), InvalidArgument)
    assert isinstance(error_of_answer(got[4]), WriterFailed)
    assert not got[2].HasField("error") and not got[5].HasField("error")
    handle = ChangelogHandle.from_proto(got[5].handle)
    assert sorted(d for _, _, d in read_all(client, handle)) == [b"b1", b"b2"]
    a.close()
    b.close()


def test_a_clients_writers_share_one_stream(proc: ServerProcess, client: ChangelogClient) -> None:
    """Sixteen writers persisting from their own threads: one Mux call at the sidecar,
    and each writer's handle holds exactly its changes."""
    writers = [
        client.create_writer(job_id="mux", operator_id=f"t{i}", key_group_range=(0, 0))
        for i in range(16)
    ]

    def run(i: int) -> list[bytes]:
        w = writers[i]
        after = 0
        out: list[bytes] = []
        for r in range(5):
            w.append(0, b"%d-%d" % (i, r))
            handle = w.persist_durably(after=after).result(timeout=30)
            out += [d for _, _, d in read_all(client, handle)]
            after = w.last_appended_sqn()
        return out

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, range(16)))
    for i, got in enumerate(results):
        assert got == [b"%d-%d" % (i, r) for r in range(5)]
    in_flight = proc.scrape_metrics()[f'dstl_grpc_requests_in_flight{{method="{MUX}"}}']
    assert in_flight == 1, "the client's writers did not share one stream"
    for w in writers:
        w.close()


def test_a_sidecar_without_mux_is_named_too_old() -> None:
    """A sidecar that predates Mux (here: a gRPC server with no method at all) answers
    UNIMPLEMENTED: the writer's call says so, and how to go on (transport='unary')."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with ChangelogClient(f"127.0.0.1:{port}", timeout_s=10) as c:
            w = c.open_writer(
                job_id="j", log_id="l", key_group_range=(0, 0), max_change_bytes=1 << 20
            )
            w.append(0, b"x")
            with pytest.raises(ConfigError, match="transport='unary'"):
                w.flush()
    finally:
        server.stop(None)
