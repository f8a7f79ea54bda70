"""Per-job credentials: one job can never touch another job's logs, handles or objects.

A real ``dstl-server`` with a node secret; each job holds the token the
sidecar derives for it (``dstl-server --print-token JOB``). Every refusal is
typed (UNAUTHENTICATED / PERMISSION_DENIED), counted, and has no effect.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client._status import to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import PermissionDenied, Unauthenticated
from dstl_server.cli import main
from dstl_server.testing import ServerProcess
from tests.integration._helpers import error_of_answer, object_files, object_path, read_all

SECRET = "k7Qv2-node-secret-9fLx3mZp8RtYw4Hs6Jd1"


def token_of(job: str, secret_file: Path) -> str:
    """Mint a token the way an operator does: the CLI, from the secret file."""
    which = ["--print-admin-token"] if job == "admin" else ["--print-token", job]
    res = subprocess.run(
        [sys.executable, "-m", "dstl_server", "--auth-secret-file", str(secret_file), *which],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return res.stdout.strip()


@dataclasses.dataclass
class Node:
    proc: ServerProcess
    root: Path
    a: ChangelogClient
    b: ChangelogClient
    admin: ChangelogClient
    b_writer: ChangelogWriter
    b_handle: ChangelogHandle
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("isolation") / "srv"
    root.mkdir(parents=True)
    secret_file = root / "secret"
    secret_file.write_text(SECRET + "\n")
    tokens = {job: token_of(job, secret_file) for job in ("jobA", "jobB", "admin")}
    with ServerProcess(root, env={"DSTL_AUTH_SECRET": SECRET}) as proc:
        a = ChangelogClient(proc.address, token=tokens["jobA"], timeout_s=20)
        b = ChangelogClient(proc.address, token=tokens["jobB"], timeout_s=20)
        admin = ChangelogClient(proc.address, token=tokens["admin"], timeout_s=20)
        try:
            w = b.create_writer(job_id="jobB", operator_id="op", key_group_range=(0, 3))
            w.append(1, b"B's data")
            h = w.persist_durably(after=0).result(timeout=30)
            yield Node(proc, root, a, b, admin, w, h, tokens)
        finally:
            for c in (a, b, admin):
                c.close()


@pytest.fixture(autouse=True)
def b_is_untouched(node: Node) -> Iterator[None]:
    yield
    assert read_all(node.b, node.b_handle) == [(1, 0, b"B's data")]
    for key in node.b_handle.object_keys:
        assert object_path(node.root, key).exists()


def intruder(client: ChangelogClient, victim: ChangelogWriter) -> ChangelogWriter:
    """A writer object of ``client`` that names the victim's log id."""
    return client.open_writer(
        job_id=victim.job_id,
        log_id=victim.log_id,
        key_group_range=victim.key_group_range,
        max_change_bytes=1 << 20,
    )


@pytest.mark.slow
def test_a_job_cannot_discard_another_jobs_objects(node: Node) -> None:
    with pytest.raises(PermissionDenied, match="jobA"):
        node.a.discard_objects("jobB", list(node.b_handle.object_keys))


def test_a_job_cannot_read_another_jobs_handle(node: Node) -> None:
    with pytest.raises(PermissionDenied):
        read_all(node.a, node.b_handle)
    # nor by relabelling the handle as its own: the keys are under jobB's prefix
    forged = dataclasses.replace(node.b_handle, job_id="jobA")
    with pytest.raises(PermissionDenied):
        read_all(node.a, forged)


def test_a_job_cannot_create_writers_for_another_job(node: Node) -> None:
    with pytest.raises(PermissionDenied):
        node.a.create_writer(job_id="jobB", operator_id="op", key_group_range=(0, 3))


@pytest.mark.parametrize("op", ["append", "persist", "truncate", "last_sqn", "close"])
def test_a_job_cannot_drive_another_jobs_writer(node: Node, op: str, transport: str) -> None:
    a = ChangelogClient(
        node.proc.address, token=node.tokens["jobA"], timeout_s=20, transport=transport
    )
    w = intruder(a, node.b_writer)
    with a, pytest.raises(PermissionDenied):
        if op == "append":
            w.append(1, b"injected")
            w.flush()
        elif op == "persist":
            w.persist_durably(after=0).result(timeout=20)
        elif op == "truncate":
            w.truncate(before=1)
        elif op == "last_sqn":
            w.last_appended_sqn()
        else:
            w._closed = False
            w.close()
    # B's writer goes on with exactly its own changes
    start = node.b_writer.last_appended_sqn()
    node.b_writer.append(2, b"more of B")
    h = node.b_writer.persist_durably(after=start).result(timeout=30)
    assert [d for _, _, d in read_all(node.b, h)] == [b"more of B"]


@pytest.mark.parametrize("who", ["jobA", "admin"])
def test_a_stream_cannot_reach_another_jobs_log(node: Node, who: str) -> None:
    """A Session stream is authorised like unary calls: it binds only to a log of the
    caller's own job (the admin token drives no writer either); each refused request
    is answered and binds nothing (a stream bound to one log names no other:
    test_bad_input)."""
    b_log = node.b_writer.log_id
    metadata = (("authorization", f"Bearer {node.tokens[who]}"),)
    channel = grpc.insecure_channel(node.proc.address)
    stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
    part = pb.KeyGroupChanges(key_group=1, count=1, sizes=b"\x08\x00\x00\x00", payload=b"injected")
    requests = [
        pb.SessionRequest(id=1, append=pb.AppendRequest(log_id=b_log, changes=[part])),
        pb.SessionRequest(id=2, persist=pb.PersistRequest(log_id=b_log, after=0)),
        pb.SessionRequest(id=3, truncate=pb.TruncateRequest(log_id=b_log, before=1)),
    ]
    try:
        answers = list(stub.Session(iter(requests), metadata=metadata, timeout=20))
    finally:
        channel.close()
    assert [a.id for a in answers] == [1, 2, 3]
    for answer in answers:
        assert isinstance(error_of_answer(answer), PermissionDenied), answer
    # B's writer goes on with exactly its own changes
    start = node.b_writer.last_appended_sqn()
    node.b_writer.append(2, b"more of B")
    h = node.b_writer.persist_durably(after=start).result(timeout=30)
    assert [d for _, _, d in read_all(node.b, h)] == [b"more of B"]


def test_a_mux_stream_refuses_another_jobs_writer_and_serves_its_own(node: Node) -> None:
    """A Mux stream carries every writer of its caller's job: a request for another job's
    writer in the same message is refused (PermissionDenied, typed, for that request
    alone) while the caller's own writer beside it is served, in order."""
    own = node.a.create_writer(job_id="jobA", operator_id="mux", key_group_range=(0, 3))
    b_log = node.b_writer.log_id
    metadata = (("authorization", f"Bearer {node.tokens['jobA']}"),)
    channel = grpc.insecure_channel(node.proc.address)
    stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
    mine = pb.KeyGroupChanges(key_group=1, count=1, sizes=b"\x04\x00\x00\x00", payload=b"mine")
    theirs = pb.KeyGroupChanges(
        key_group=1, count=1, sizes=b"\x08\x00\x00\x00", payload=b"injected"
    )
    message = pb.MuxRequest(
        calls=[
            pb.SessionRequest(id=1, append=pb.AppendRequest(log_id=own.log_id, changes=[mine])),
            pb.SessionRequest(id=2, append=pb.AppendRequest(log_id=b_log, changes=[theirs])),
            pb.SessionRequest(id=3, persist=pb.PersistRequest(log_id=b_log, after=0)),
            pb.SessionRequest(id=4, persist=pb.PersistRequest(log_id=own.log_id, after=0)),
        ]
    )
    try:
        answers = [
            a for m in stub.Mux(iter([message]), metadata=metadata, timeout=20) for a in m.answers
        ]
    finally:
        channel.close()
        own.close()
    by_id = {a.id: a for a in answers}
    assert sorted(by_id) == [1, 2, 3, 4]
    for rid in (2, 3):
        assert isinstance(error_of_answer(by_id[rid]), PermissionDenied), by_id[rid]
    assert not by_id[1].HasField("error") and not by_id[4].HasField("error"), answers
    handle = ChangelogHandle.from_proto(by_id[4].handle)
    assert [d for _, _, d in read_all(node.a, handle)] == [b"mine"]


def test_a_stream_without_a_valid_token_is_unauthenticated(node: Node) -> None:
    channel = grpc.insecure_channel(node.proc.address)
    stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
    req = pb.SessionRequest(
        id=1, last_appended_sqn=pb.LastAppendedSqnRequest(log_id=node.b_writer.log_id)
    )
    try:
        for metadata in ((), (("authorization", "Bearer dstl1.job.jobB.AAAA"),)):
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Session(iter([req]), metadata=metadata, timeout=20))
            assert isinstance(to_dstl_error(info.value), Unauthenticated)
    finally:
        channel.close()


@pytest.mark.parametrize(
    "token", [None, " ", "wrong", "dstl1.job.jobB.AAAA", "dstl1.admin.x", "x" * 5000]
)
def test_calls_without_a_valid_token_are_unauthenticated(node: Node, token: str | None) -> None:
    before = node.proc.scrape_metrics().get(
        'dstl_auth_refusals_total{reason="unauthenticated"}', 0.0
    )
    with ChangelogClient(node.proc.address, token=token, timeout_s=10) as anon:
        with pytest.raises(Unauthenticated):
            anon.create_writer(job_id="jobB", operator_id="op", key_group_range=(0, 3))
        with pytest.raises(Unauthenticated):
            read_all(anon, node.b_handle)
        with pytest.raises(Unauthenticated):
            anon.discard_objects("jobB", list(node.b_handle.object_keys))
        with pytest.raises(Unauthenticated):
            intruder(anon, node.b_writer).persist_durably(after=0).result(timeout=10)
    after = node.proc.scrape_metrics()['dstl_auth_refusals_total{reason="unauthenticated"}']
    assert after - before >= 4
    # health stays open for probes
    channel = grpc.insecure_channel(node.proc.address)
    try:
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()


def test_permission_refusals_are_counted(node: Node) -> None:
    key = 'dstl_auth_refusals_total{reason="permission_denied"}'
    before = node.proc.scrape_metrics().get(key, 0.0)
    with pytest.raises(PermissionDenied):
        node.a.discard_objects("jobB", list(node.b_handle.object_keys))
    assert node.proc.scrape_metrics()[key] == before + 1


def test_the_admin_token_reads_and_discards_but_creates_no_writer(node: Node) -> None:
    assert read_all(node.admin, node.b_handle) == [(1, 0, b"B's data")]
    with pytest.raises(PermissionDenied, match="admin"):
        node.admin.create_writer(job_id="jobB", operator_id="op", key_group_range=(0, 3))
    # discarding an object of B that no handle refers to (a fresh, separate one)
    w = node.b.create_writer(job_id="jobB", operator_id="tmp", key_group_range=(0, 0))
    w.append(0, b"scratch")
    scratch = w.persist_durably(after=0).result(timeout=30)
    w.close()
    files = len(object_files(node.root))
    assert node.admin.discard_objects("jobB", list(scratch.object_keys)) == 1
    assert len(object_files(node.root)) == files - 1


def test_a_job_token_works_for_its_own_job(node: Node) -> None:
    w = node.a.create_writer(job_id="jobA", operator_id="op", key_group_range=(0, 0))
    w.append(0, b"A's data")
    h = w.persist_durably(after=0).result(timeout=30)
    assert read_all(node.a, h) == [(0, 0, b"A's data")]
    with pytest.raises(PermissionDenied):
        read_all(node.b, h)
    assert node.a.discard_objects("jobA", list(h.object_keys)) == 1
    w.close()


# ------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("args", "env", "why"),
    [
        (["--listen", "0.0.0.0:7070"], {}, "TLS"),
        (["--listen", "0.0.0.0:7070"], {"DSTL_AUTH_SECRET": SECRET}, "TLS"),
        (["--listen", "0.0.0.0:7070", "--tls-cert", "c.pem", "--tls-key", "k.pem"], {}, "secret"),
        ([], {"DSTL_AUTH_SECRET": " "}, "set but empty"),
        ([], {"DSTL_AUTH_SECRET": "a" * 64}, "too weak"),
    ],
)
def test_unsafe_auth_configuration_exits_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    env: dict[str, str],
    why: str,
) -> None:
    monkeypatch.delenv("DSTL_AUTH_SECRET", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = main([*args, "--storage", f"file://{tmp_path}/o", "--print-config"])
    err = capsys.readouterr().err
    assert code == 2
    assert why in err and len(err.strip().splitlines()) == 1


def test_the_secret_is_never_a_flag_and_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--auth-secret", SECRET, "--print-config"]) == 2
    assert main(["--auth-token", SECRET, "--print-config"]) == 2
    assert main([f"--auth-secret={SECRET}"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --auth-secret" in err and SECRET not in err
    monkeypatch.setenv("DSTL_AUTH_SECRET", SECRET)
    assert main(["--storage", f"file://{tmp_path}/o", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out and "auth_secret = '***'" in out
