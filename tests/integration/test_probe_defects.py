"""Defects an adversarial probe found, each reproduced on the wire against a real sidecar.

One ``dstl-server`` process serves the module (short call-order timeout, a
small per-job writer quota); after every test a bystander writer of another
job must still append, persist and read back every byte it ever wrote.
"""

from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dstl_client import ChangelogClient
from dstl_client._status import to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    BudgetFull,
    CallLost,
    InvalidArgument,
    InvalidHandle,
    KeyGroupOutOfRange,
    LogNotFound,
    SqnOutOfRange,
    TooManyWriters,
    WriterFailed,
)
from dstl_client.core.format import MAX_PARTS_PER_REQUEST
from dstl_server.testing import ServerProcess
from tests.integration._helpers import Sidecar, error_of, poll_until, sidecar_with_bystander

JOB = "job-probe"
ORDER_TIMEOUT_S = 5.0  # long enough that a loaded machine never reaches it by accident
PER_JOB = 4
KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    root = tmp_path_factory.mktemp("probe") / "srv"
    args = [
        "--call-order-timeout-s",
        str(ORDER_TIMEOUT_S),
        "--max-writers-per-job",
        str(PER_JOB),
        "--max-in-flight-bytes",
        str(16 << 20),
        "--batch-size-threshold",
        str(4 << 20),
    ]
    with sidecar_with_bystander(root, args) as sidecar:
        yield sidecar


@pytest.fixture(autouse=True)
def bystander_survives(sidecar: Sidecar) -> Iterator[None]:
    yield
    sidecar.bystander.assert_intact()
    assert_healthy(sidecar)


def assert_healthy(sidecar: Sidecar) -> None:
    resp = health_pb2_grpc.HealthStub(sidecar.channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=1.0
    )
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
def log_id(sidecar: Sidecar) -> Iterator[str]:
    resp = sidecar.stub.CreateWriter(
        pb.CreateWriterRequest(job_id=JOB, operator_id="op", first_key_group=0, last_key_group=7),
        timeout=10,
    )
    yield resp.log_id
    try:
        sidecar.stub.CloseWriter(pb.CloseWriterRequest(log_id=resp.log_id), timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND


def group(kg: int, *changes: bytes) -> pb.KeyGroupChanges:
    return pb.KeyGroupChanges(
        key_group=kg,
        count=len(changes),
        sizes=struct.pack(f"<{len(changes)}I", *map(len, changes)),
        payload=b"".join(changes),
    )


# ----------------------------------------------------------------- defect 2
@pytest.mark.parametrize("seq", [10**7, 2**62, 2**64 - 1])
def test_a_huge_seq_is_refused_at_once_without_stalling(
    sidecar: Sidecar, log_id: str, seq: int
) -> None:
    session = secrets.randbits(62) | 1
    started = time.monotonic()
    err = error_of(
        sidecar.stub.Append,
        pb.AppendRequest(log_id=log_id, changes=[group(1, b"x")], session=session, seq=seq),
        timeout=ORDER_TIMEOUT_S * 5,
    )
    assert isinstance(err, CallLost) and "in flight" in err.message
    # refused at once, not after the call-order timeout
    assert time.monotonic() - started < ORDER_TIMEOUT_S
    # the session stays failed: its next call cannot slip over the refused one
    err = error_of(
        sidecar.stub.Append,
        pb.AppendRequest(log_id=log_id, changes=[group(1, b"y")], session=session, seq=1),
    )
    assert isinstance(err, CallLost)


# ----------------------------------------------------------------- defect 3
def test_zero_change_key_groups_are_refused(sidecar: Sidecar, log_id: str) -> None:
    empty = [pb.KeyGroupChanges(key_group=kg % 8, count=0) for kg in range(1000)]
    err = error_of(sidecar.stub.Append, pb.AppendRequest(log_id=log_id, changes=empty))
    assert isinstance(err, InvalidArgument) and "at least one change" in err.message


def test_tiny_parts_are_charged_to_the_memory_budget(sidecar: Sidecar, log_id: str) -> None:
    before = sidecar.proc.scrape_metrics()["dstl_unuploaded_bytes"]
    parts = 10_000  # one empty change each: 4 bytes of data, but an object per part
    sidecar.stub.Append(
        pb.AppendRequest(log_id=log_id, changes=[group(kg % 8, b"") for kg in range(parts)]),
        timeout=20,
    )
    charged = sidecar.proc.scrape_metrics()["dstl_unuploaded_bytes"] - before
    # far more than the 80 kB of sizes: what the server really holds per part
    assert charged >= parts * 128


# ----------------------------------------------------------------- defect 6
@pytest.mark.parametrize(
    "bad",
    [
        pytest.param([], id="empty-batch"),
        pytest.param([pb.KeyGroupChanges(key_group=1, count=0)], id="zero-count"),
    ],
)
def test_a_call_refused_for_its_content_keeps_the_sequence(
    sidecar: Sidecar, log_id: str, bad: list[pb.KeyGroupChanges]
) -> None:
    session = secrets.randbits(62) | 1
    err = error_of(
        sidecar.stub.Append, pb.AppendRequest(log_id=log_id, changes=bad, session=session, seq=1)
    )
    assert isinstance(err, InvalidArgument)
    started = time.monotonic()
    sidecar.stub.Append(
        pb.AppendRequest(log_id=log_id, changes=[group(2, b"ok")], session=session, seq=2),
        timeout=20,
    )
    assert time.monotonic() - started < ORDER_TIMEOUT_S  # did not wait for a "missing" call


def test_a_refused_call_with_changes_fails_the_session(sidecar: Sidecar, log_id: str) -> None:
    session = secrets.randbits(62) | 1
    ok = pb.AppendRequest(log_id=log_id, changes=[group(1, b"a")], session=session, seq=1)
    sidecar.stub.Append(ok, timeout=20)
    err = error_of(
        sidecar.stub.Append,
        pb.AppendRequest(
            log_id=log_id, changes=[group(1, b"b"), group(99, b"c")], session=session, seq=2
        ),
    )
    assert isinstance(err, KeyGroupOutOfRange)
    # a later persist would miss "b": it is refused, never a short handle
    err = error_of(
        sidecar.stub.PersistDurably,
        pb.PersistRequest(log_id=log_id, after=0, session=session, seq=3),
    )
    assert isinstance(err, WriterFailed) and "call 2" in err.message


@pytest.mark.slow
def test_a_call_never_sent_is_reported_accurately(sidecar: Sidecar, log_id: str) -> None:
    session = secrets.randbits(62) | 1
    err = error_of(
        sidecar.stub.Append,
        pb.AppendRequest(log_id=log_id, changes=[group(1, b"a")], session=session, seq=2),
    )
    assert isinstance(err, CallLost) and "call 1 " in err.message


# ----------------------------------------------------------------- defect 7
def _handle(log_id: str, **entry: int) -> pb.Handle:
    e = {"offset": 0, "length": 100, "first_sqn": 0, "end_sqn": 1} | entry
    return pb.Handle(
        format_version=1,
        job_id=JOB,
        log_id=log_id,
        first_key_group=0,
        last_key_group=7,
        from_sqn=0,
        to_sqn=1,
        entries=[pb.HandleEntry(object_key=f"{JOB}/ab/{'c' * 32}.dstl", **e)],
    )


@pytest.mark.parametrize(
    "entry",
    [
        {"length": 2**64 - 1},
        {"length": 2**40},
        {"offset": 2**63},
        {"offset": 2**64 - 1},
        {"first_sqn": 2**64 - 2, "end_sqn": 2**64 - 1},
    ],
)
def test_huge_numbers_in_a_handle_are_an_invalid_handle(
    sidecar: Sidecar, log_id: str, entry: dict[str, int]
) -> None:
    err = error_of(sidecar.stub.ReadChanges, pb.ReadChangesRequest(handle=_handle(log_id, **entry)))
    assert isinstance(err, InvalidHandle)


@pytest.mark.parametrize("method", ["Append", "PersistDurably", "ReadChanges", "CreateWriter"])
def test_garbage_request_bytes_are_invalid_argument(sidecar: Sidecar, method: str) -> None:
    path = f"/dstl.v1.Changelog/{method}"
    if method == "ReadChanges":
        call = sidecar.channel.unary_stream(path)
    else:
        call = sidecar.channel.unary_unary(path)
    err = error_of(call, b"\xff\xff\xff\xff\x0f garbage")
    assert isinstance(err, InvalidArgument) and "do not decode" in err.message


# ----------------------------------------------------------------- defect 5
def test_one_job_cannot_take_every_writer_slot(sidecar: Sidecar) -> None:
    mine = []
    try:
        for i in range(PER_JOB):
            mine.append(
                sidecar.client.create_writer(
                    job_id="greedy", operator_id=f"op{i}", key_group_range=(0, 0)
                )
            )
        with pytest.raises(TooManyWriters, match="max_writers_per_job"):
            sidecar.client.create_writer(job_id="greedy", operator_id="x", key_group_range=(0, 0))
        other = sidecar.client.create_writer(
            job_id="modest", operator_id="op", key_group_range=(0, 0)
        )
        other.close()
    finally:
        for w in mine:
            w.close()
    # closing frees the job's slots
    sidecar.client.create_writer(job_id="greedy", operator_id="y", key_group_range=(0, 0)).close()


def test_writers_of_a_dead_client_expire(tmp_path: Path) -> None:
    with (
        ServerProcess(tmp_path / "srv", extra_args=["--writer-idle-timeout-s", "0.4"]) as proc,
        ChangelogClient(proc.address, timeout_s=10) as client,
    ):
        w = client.create_writer(job_id="j", operator_id="op", key_group_range=(0, 0))
        w.append(0, b"persisted")
        h = w.persist_durably(after=0).result(timeout=30)
        poll_until(lambda: proc.scrape_metrics()["dstl_writers"] == 0, "the idle writer expired")
        assert proc.scrape_metrics()["dstl_writers_expired_total"] == 1
        with pytest.raises(LogNotFound, match="expired"):
            w.last_appended_sqn()
        # what it had persisted stays readable
        assert [d for _, _, d in client.read_changes(h)] == [b"persisted"]


@pytest.mark.slow
def test_calls_parked_behind_a_missing_call_are_bounded(sidecar: Sidecar, log_id: str) -> None:
    """Requests waiting for an earlier call count in the one memory budget
    (max_in_flight_bytes, 16 MiB here), which a call passes by at most its own size: once it
    is reached, a further call is refused at once (``BudgetFull``), never parked."""
    session = secrets.randbits(62) | 1
    big = group(1, b"a" * (3 << 20), b"b" * (3 << 20))  # 6 MiB each
    parked = [
        sidecar.stub.Append.future(
            pb.AppendRequest(log_id=log_id, changes=[big], session=session, seq=seq), timeout=20
        )
        for seq in (2, 3, 4)
    ]
    poll_until(
        lambda: sidecar.proc.scrape_metrics()["dstl_parked_bytes"] >= 18 << 20,
        "three calls parked: the budget passed by at most one request",
        timeout_s=10,
    )
    started = time.monotonic()
    err = error_of(
        sidecar.stub.Append,
        pb.AppendRequest(log_id=log_id, changes=[big], session=session, seq=5),
    )
    assert isinstance(err, BudgetFull), err
    assert time.monotonic() - started < ORDER_TIMEOUT_S
    # nothing more was parked: three requests and their per-part charges
    assert sidecar.proc.scrape_metrics()["dstl_parked_bytes"] < (18 << 20) + (64 << 10)
    for fut in parked:  # call 1 never came: refused, never applied out of order
        with pytest.raises(grpc.RpcError) as info:
            fut.result(timeout=20)
        assert isinstance(to_dstl_error(info.value), WriterFailed | CallLost)


def test_a_request_with_too_many_parts_is_refused_before_any_work(
    sidecar: Sidecar, log_id: str
) -> None:
    many = [group(kg % 8, b"") for kg in range(MAX_PARTS_PER_REQUEST + 1)]
    err = error_of(sidecar.stub.Append, pb.AppendRequest(log_id=log_id, changes=many))
    assert isinstance(err, InvalidArgument) and "at most" in err.message


def test_a_changeset_larger_than_a_message_is_read_back_in_pieces(tmp_path: Path) -> None:
    """Every append between two persists forms one changeset per key group;
    the wire fuzz found one that outgrew the message limit, and ReadChanges
    answered RESOURCE_EXHAUSTED instead of the changes."""
    limit = MiB
    args = ["--max-request-bytes", str(limit), "--max-change-bytes", str(256 * KiB)]
    with (
        ServerProcess(tmp_path / "srv", extra_args=args) as proc,
        ChangelogClient(
            proc.address, timeout_s=30, batch_bytes=256 * KiB, max_message_bytes=limit
        ) as client,
    ):
        w = client.create_writer(job_id="j", operator_id="op", key_group_range=(0, 1))
        changes = [secrets.token_bytes(100 * KiB + i) for i in range(30)]  # ~3 MiB
        for data in changes:
            w.append(1, data)
        w.append(0, b"small")
        handle = w.persist_durably(after=0).result(timeout=60)
        views = list(client.read_changesets(handle, [1]))
        assert len(views) > 1 and all(v.nbytes <= limit for v in views)
        assert {(v.key_group, v.sqn) for v in views} == {(1, 0)}
        assert [c for v in views for c in v.changes()] == changes
        assert sorted(d for _, _, d in client.read_changes(handle)) == sorted([*changes, b"small"])


@pytest.mark.slow
def test_a_handle_too_large_for_a_message_is_a_typed_error(tmp_path: Path) -> None:
    """A persist from an old SQN of a never-truncated log names more sections
    than a message carries: a clear SqnOutOfRange, not a bare transport error."""
    limit = 64 * KiB + 1024
    args = ["--max-request-bytes", str(limit), "--max-change-bytes", "1024"]
    with (
        ServerProcess(tmp_path / "srv", extra_args=args) as proc,
        ChangelogClient(proc.address, timeout_s=30, batch_bytes=1024, max_message_bytes=limit) as c,
    ):
        w = c.create_writer(job_id="j", operator_id="op", key_group_range=(0, 0))
        after = 0
        for _ in range(800):  # one section per persist, ~55 bytes of handle each
            w.append(0, b"x" * 8)
            after = w.persist_durably(after=after).result(timeout=30).to_sqn
        with pytest.raises(SqnOutOfRange, match="truncate the log"):
            w.persist_durably(after=0).result(timeout=30)
