"""Bad input gets a clear typed error and leaves every other writer untouched.

One real ``dstl-server`` (with a small ``--max-change-bytes``) serves the whole
module; after every test a bystander writer of another job must still append,
persist and read back every byte it ever wrote. Writer calls are checked over
both transports (``transport``: unary calls, the Session stream); the
stream's own bad input (undecodable bytes, a second log, a request without a
call, huge numbers) at the end.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from collections.abc import Iterator

import grpc
import pytest

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client._status import to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    ChangeTooLarge,
    CorruptObject,
    InvalidArgument,
    InvalidHandle,
    KeyGroupOutOfRange,
    LogNotFound,
    PermissionDenied,
    SqnOutOfRange,
    WriterClosed,
    WriterFailed,
)
from dstl_client.core.handle import HandleEntry
from dstl_server.session import MAX_WAITING_PERSISTS
from tests.integration._helpers import (
    Sidecar,
    error_of,
    error_of_answer,
    object_path,
    on_stream,
    read_all,
    refusal,
    sidecar_with_bystander,
)

MAX_CHANGE = 4096
JOB = "job-bad-input"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    root = tmp_path_factory.mktemp("bad-input") / "srv"
    with sidecar_with_bystander(root, ["--max-change-bytes", str(MAX_CHANGE)]) as sidecar:
        yield sidecar


@pytest.fixture(autouse=True)
def bystander_survives(sidecar: Sidecar) -> Iterator[None]:
    yield
    sidecar.bystander.assert_intact()


@pytest.fixture
def writer(sidecar: Sidecar, transport: str) -> Iterator[ChangelogWriter]:
    with ChangelogClient(sidecar.proc.address, timeout_s=20, transport=transport) as client:
        w = client.create_writer(job_id=JOB, operator_id="op", key_group_range=(10, 19))
        yield w
        w.close()


def packed(*changes: bytes) -> tuple[int, bytes, bytes]:
    return len(changes), struct.pack(f"<{len(changes)}I", *map(len, changes)), b"".join(changes)


def assert_writer_still_works(client: ChangelogClient, w: ChangelogWriter) -> None:
    """The writer that got the bad input carries on with exactly its good data."""
    w.append(10, b"still fine")
    h = w.persist_durably(after=0).result(timeout=30)
    assert [d for _, _, d in read_all(client, h)][-1] == b"still fine"


# --------------------------------------------------------------- unknown logs
def test_unknown_log_id(sidecar: Sidecar, transport: str) -> None:
    unknown = uuid.uuid4().hex
    for method, req in (
        (
            "Append",
            pb.AppendRequest(
                log_id=unknown,
                changes=[
                    pb.KeyGroupChanges(
                        key_group=0, count=1, sizes=struct.pack("<I", 1), payload=b"x"
                    )
                ],
            ),
        ),
        ("LastAppendedSqn", pb.LastAppendedSqnRequest(log_id=unknown)),
        ("PersistDurably", pb.PersistRequest(log_id=unknown, after=0)),
        ("Truncate", pb.TruncateRequest(log_id=unknown, before=0)),
        ("CloseWriter", pb.CloseWriterRequest(log_id=unknown)),
    ):
        if method == "CloseWriter":  # unary only
            err = error_of(sidecar.stub.CloseWriter, req)
        else:
            err = refusal(sidecar.stub, transport, method, req)
        assert isinstance(err, LogNotFound), err
        assert unknown in err.message


def test_closed_writer(sidecar: Sidecar) -> None:
    w = sidecar.client.create_writer(job_id=JOB, operator_id="op", key_group_range=(0, 0))
    w.append(0, b"dropped")
    w.close()
    with pytest.raises(WriterClosed):
        w.append(0, b"more")
    with pytest.raises(WriterClosed):
        w.persist_durably(after=0)
    # The sidecar forgot the log: its id is unknown now, however it is reached.
    err = error_of(sidecar.stub.LastAppendedSqn, pb.LastAppendedSqnRequest(log_id=w.log_id))
    assert isinstance(err, LogNotFound)


# ------------------------------------------------------------------ key groups
def test_key_group_outside_range_client_side(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    writer.append(10, b"good")
    for kg in (9, 20, 1 << 20):
        with pytest.raises(KeyGroupOutOfRange, match=str(kg)):
            writer.append(kg, b"bad")
        with pytest.raises(KeyGroupOutOfRange):
            writer.append_many([(11, b"ok"), (kg, b"bad")])
    h = writer.persist_durably(after=0).result(timeout=30)
    # append_many checks change by change: the good change before the bad one is kept.
    assert [(kg, d) for kg, _, d in read_all(sidecar.client, h)] == [(10, b"good")] + [
        (11, b"ok")
    ] * 3


def test_key_group_outside_range_server_side(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    writer.append(10, b"before")
    writer.flush()
    count, sizes, payload = packed(b"bad")
    ok = pb.KeyGroupChanges(key_group=11, count=count, sizes=sizes, payload=payload)
    for kg in (9, 20):
        bad = pb.KeyGroupChanges(key_group=kg, count=count, sizes=sizes, payload=payload)
        req = pb.AppendRequest(log_id=writer.log_id, changes=[ok, bad])
        err = refusal(sidecar.stub, writer.transport.name, "Append", req)
        assert isinstance(err, KeyGroupOutOfRange), err
        assert str(kg) in err.message
    # The whole batch was refused: the valid part of it was not appended either.
    h = writer.persist_durably(after=0).result(timeout=30)
    assert read_all(sidecar.client, h) == [(10, 0, b"before")]
    assert_writer_still_works(sidecar.client, writer)


def test_bad_key_group_range_at_create(sidecar: Sidecar) -> None:
    with pytest.raises(InvalidArgument, match="key-group range"):
        sidecar.client.create_writer(job_id=JOB, operator_id="op", key_group_range=(5, 4))
    with pytest.raises(InvalidArgument, match="operator_id"):
        sidecar.client.create_writer(job_id=JOB, operator_id="", key_group_range=(0, 4))


# ----------------------------------------------------------------- change size
def test_change_over_max_change_bytes(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    writer.append(10, b"x" * MAX_CHANGE)  # exactly the limit is fine
    with pytest.raises(ChangeTooLarge, match=str(MAX_CHANGE)):
        writer.append(10, b"x" * (MAX_CHANGE + 1))
    # Server side, bypassing the client's check.
    count, sizes, payload = packed(b"y", b"y" * (MAX_CHANGE + 1))
    req = pb.AppendRequest(
        log_id=writer.log_id,
        changes=[pb.KeyGroupChanges(key_group=12, count=count, sizes=sizes, payload=payload)],
    )
    err = refusal(sidecar.stub, writer.transport.name, "Append", req)
    assert isinstance(err, ChangeTooLarge), err
    assert str(MAX_CHANGE + 1) in err.message and str(MAX_CHANGE) in err.message
    h = writer.persist_durably(after=0).result(timeout=30)
    assert [(kg, len(d)) for kg, _, d in read_all(sidecar.client, h)] == [(10, MAX_CHANGE)]


@pytest.mark.parametrize(
    ("count", "sizes", "payload", "reason"),
    [
        (2, struct.pack("<I", 3), b"abc", "sizes holds 4 bytes for 2 changes"),
        (2, struct.pack("<2I", 3, 3), b"abc", "add up to 6"),
        (1, struct.pack("<I", 1), b"abc", "add up to 1"),
        (0, b"", b"abc", "payload without changes"),
        (1, b"\x01\x00", b"a", "sizes holds 2 bytes"),
    ],
)
def test_malformed_packed_changes(
    sidecar: Sidecar, writer: ChangelogWriter, count: int, sizes: bytes, payload: bytes, reason: str
) -> None:
    req = pb.AppendRequest(
        log_id=writer.log_id,
        changes=[pb.KeyGroupChanges(key_group=10, count=count, sizes=sizes, payload=payload)],
    )
    err = refusal(sidecar.stub, writer.transport.name, "Append", req)
    assert type(err) is InvalidArgument, err
    assert reason in err.message
    assert_writer_still_works(sidecar.client, writer)


def test_empty_append_batch(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    req = pb.AppendRequest(log_id=writer.log_id)
    err = refusal(sidecar.stub, writer.transport.name, "Append", req)
    assert isinstance(err, InvalidArgument) and "empty" in err.message


# ----------------------------------------------------------------------- SQNs
def test_sqn_from_the_future(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    writer.append(10, b"a")
    now = writer.last_appended_sqn()
    with pytest.raises(SqnOutOfRange, match=f"only at {now}"):
        writer.persist_durably(after=now + 1).result(timeout=30)
    with pytest.raises(SqnOutOfRange, match=f"only at {now}"):
        writer.truncate(before=now + 5)
    # Neither call changed the log.
    h = writer.persist_durably(after=0).result(timeout=30)
    assert read_all(sidecar.client, h) == [(10, 0, b"a")]


def test_persist_after_truncated_sqn(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    writer.append(10, b"a")
    t1 = writer.last_appended_sqn()
    writer.append(11, b"b")
    t2 = writer.last_appended_sqn()
    writer.persist_durably(after=0).result(timeout=30)
    writer.truncate(before=t2)
    for after in (0, t1):
        with pytest.raises(SqnOutOfRange, match="truncated"):
            writer.persist_durably(after=after).result(timeout=30)
    writer.truncate(before=t1)  # truncating less than before is a no-op, not an error
    writer.append(12, b"c")
    h = writer.persist_durably(after=t2).result(timeout=30)
    assert [(kg, d) for kg, _, d in read_all(sidecar.client, h)] == [(12, b"c")]


# -------------------------------------------------------------------- handles
@pytest.fixture
def handle(sidecar: Sidecar, writer: ChangelogWriter) -> ChangelogHandle:
    writer.append(10, b"mine")
    return writer.persist_durably(after=0).result(timeout=30)


@pytest.mark.parametrize(
    "blob",
    [
        b"\xff\xff\xff\xff not a handle",
        b"",  # decodes to an all-default message: version 0
        pb.Handle(format_version=99, log_id="0" * 32).SerializeToString(),
        pb.Handle(format_version=1, log_id="zz" * 16).SerializeToString(),
        pb.Handle(format_version=1, log_id="0" * 32, from_sqn=5, to_sqn=2).SerializeToString(),
        pb.Handle(
            format_version=1, log_id="0" * 32, first_key_group=9, last_key_group=3
        ).SerializeToString(),
        pb.Handle(
            format_version=1,
            log_id="0" * 32,
            to_sqn=3,
            entries=[pb.HandleEntry(object_key="k", offset=0, length=0, first_sqn=0, end_sqn=1)],
        ).SerializeToString(),
    ],
)
def test_malformed_handle_bytes(sidecar: Sidecar, blob: bytes) -> None:
    with pytest.raises(InvalidHandle):
        ChangelogHandle.from_bytes(blob)
    # The sidecar refuses the same handle when a client sends it anyway.
    msg = pb.Handle()
    try:
        msg.ParseFromString(blob)
    except Exception:
        return
    err = error_of(sidecar.stub.ReadChanges, pb.ReadChangesRequest(handle=msg))
    assert isinstance(err, InvalidHandle), err


def test_handle_pointing_to_another_jobs_objects(sidecar: Sidecar, handle: ChangelogHandle) -> None:
    other_key = sidecar.bystander.writer.persist_durably(after=0).result(30).object_keys[0]
    assert other_key.startswith("other-job/")
    forged = dataclasses.replace(
        handle, entries=(dataclasses.replace(handle.entries[0], object_key=other_key),)
    )
    with pytest.raises(PermissionDenied, match="does not belong"):
        read_all(sidecar.client, forged)
    # Claiming to be the other job does not help either: the keys are still this job's.
    with pytest.raises(PermissionDenied):
        read_all(sidecar.client, dataclasses.replace(handle, job_id="other-job"))
    for key in ("../other-job/ab/" + "0" * 32 + ".dstl", f"{JOB}/../../etc/passwd"):
        bad = dataclasses.replace(
            handle, entries=(dataclasses.replace(handle.entries[0], object_key=key),)
        )
        with pytest.raises(PermissionDenied):
            read_all(sidecar.client, bad)
    assert read_all(sidecar.client, handle) == [(10, 0, b"mine")]


def test_handle_of_another_log_in_same_object(
    sidecar: Sidecar, writer: ChangelogWriter, handle: ChangelogHandle
) -> None:
    """A handle naming a section of another writer is caught, not read as its own."""
    forged = dataclasses.replace(handle, log_id=uuid.uuid4().hex)
    with pytest.raises(CorruptObject, match="belongs to log"):
        read_all(sidecar.client, forged)


def test_read_key_groups_outside_the_handle(sidecar: Sidecar, handle: ChangelogHandle) -> None:
    with pytest.raises(InvalidArgument, match="outside"):
        read_all(sidecar.client, handle, key_groups=[10, 99])


def test_discard_objects_of_another_job(sidecar: Sidecar, handle: ChangelogHandle) -> None:
    other = sidecar.bystander.writer.persist_durably(after=0).result(30)
    other_key = other.object_keys[0]
    with pytest.raises(PermissionDenied, match="does not belong"):
        sidecar.client.discard_objects(JOB, [handle.object_keys[0], other_key])
    # All or nothing: the call deleted neither key.
    assert object_path(sidecar.root, other_key).exists()
    assert object_path(sidecar.root, handle.object_keys[0]).exists()
    with pytest.raises(PermissionDenied):
        sidecar.client.discard_objects(JOB, ["../other-job/" + other_key])


@pytest.mark.parametrize("job_id", ["", "a/b", "../etc", "-leading-dash", "x" * 129, "sp ace"])
def test_bad_job_id(sidecar: Sidecar, job_id: str) -> None:
    with pytest.raises(InvalidArgument, match="bad job id"):
        sidecar.client.create_writer(job_id=job_id, operator_id="op", key_group_range=(0, 1))
    with pytest.raises(InvalidArgument, match="bad job id"):
        sidecar.client.discard_objects(job_id, [])
    h = ChangelogHandle(job_id, uuid.uuid4().hex, (0, 1), 0, 1, (HandleEntry("k", 0, 1, 0, 1),))
    with pytest.raises(InvalidArgument, match="bad job id"):
        read_all(sidecar.client, h)


# ------------------------------------------------------------ the Session stream
def _append(log_id: str, kg: int, *changes: bytes) -> pb.AppendRequest:
    count, sizes, payload = packed(*changes)
    part = pb.KeyGroupChanges(key_group=kg, count=count, sizes=sizes, payload=payload)
    return pb.AppendRequest(log_id=log_id, changes=[part])


def test_stream_undecodable_bytes_end_the_stream(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    session = sidecar.channel.stream_stream(
        "/dstl.v1.Changelog/Session",
        request_serializer=lambda raw: raw,
        response_deserializer=pb.SessionResponse.FromString,
    )
    ok = pb.SessionRequest(id=1, append=_append(writer.log_id, 10, b"kept"))
    with pytest.raises(grpc.RpcError) as info:
        list(session(iter([ok.SerializeToString(), b"\xff\xff\xff not a request"]), timeout=20))
    err = to_dstl_error(info.value)
    assert type(err) is InvalidArgument and "do not decode" in err.message, err
    # The request before it was applied; the writer goes on.
    h = writer.persist_durably(after=0).result(timeout=30)
    assert [d for _, _, d in read_all(sidecar.client, h)] == [b"kept"]


def test_stream_is_bound_to_its_first_log(sidecar: Sidecar) -> None:
    """One stream, one writer: a request naming another log is refused, and applies nothing."""
    mine = sidecar.client.create_writer(job_id=JOB, operator_id="a", key_group_range=(0, 3))
    other = sidecar.client.create_writer(job_id=JOB, operator_id="b", key_group_range=(0, 3))
    answers, ended = on_stream(
        sidecar.stub,
        [
            pb.SessionRequest(id=1, append=_append(mine.log_id, 1, b"mine")),
            pb.SessionRequest(id=2, truncate=pb.TruncateRequest(log_id=other.log_id, before=0)),
            pb.SessionRequest(id=3, last_appended_sqn=pb.LastAppendedSqnRequest()),  # no log id
            pb.SessionRequest(id=4, persist=pb.PersistRequest(after=0)),
        ],
    )
    assert ended is None
    by_id = {a.id: a for a in answers}
    assert sorted(by_id) == [1, 2, 3, 4]
    err = error_of_answer(by_id[2])
    assert type(err) is InvalidArgument and "bound to writer" in err.message, err
    assert not by_id[1].HasField("error") and not by_id[3].HasField("error")
    assert by_id[3].sqn == 1  # the append closed into changeset 0
    assert [d for _, _, d in read_all(sidecar.client, _handle(by_id[4]))] == [b"mine"]
    assert other.persist_durably(after=0).result(timeout=30).entries == ()
    mine.close()
    other.close()


def _handle(answer: pb.SessionResponse) -> ChangelogHandle:
    assert not answer.HasField("error"), answer
    return ChangelogHandle.from_proto(answer.handle)


def test_stream_refused_changes_fail_the_rest_of_the_stream(
    sidecar: Sidecar, writer: ChangelogWriter
) -> None:
    """A refused request that carried changes: every later request of that stream is
    refused (WriterFailed), so no handle of it misses them; requests without a
    call count as such (they may come from a newer client)."""
    log_id = writer.log_id
    for bad in (
        pb.SessionRequest(id=2, append=_append(log_id, 99, b"outside the range")),
        pb.SessionRequest(id=2, persist=pb.PersistRequest(changes=[pb.KeyGroupChanges()])),
        pb.SessionRequest(id=2),  # no call at all
    ):
        answers, ended = on_stream(
            sidecar.stub,
            [
                pb.SessionRequest(id=1, last_appended_sqn=pb.LastAppendedSqnRequest(log_id=log_id)),
                bad,
                pb.SessionRequest(id=3, append=_append(log_id, 10, b"after the hole")),
                pb.SessionRequest(id=4, persist=pb.PersistRequest(after=0)),
            ],
        )
        assert ended is None and [a.id for a in answers] == [1, 2, 3, 4]
        assert isinstance(error_of_answer(answers[1]), InvalidArgument)
        for later in answers[2:]:
            assert isinstance(error_of_answer(later), WriterFailed), later
    # the writer's own stream (or calls) never saw any of it
    assert_writer_still_works(sidecar.client, writer)
    h = writer.persist_durably(after=0).result(timeout=30)
    assert [d for _, _, d in read_all(sidecar.client, h)] == [b"still fine"]


def test_stream_huge_numbers_cost_nothing(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    """Ids are echoed, never used to size anything; SQNs and counts far out of range are
    typed refusals that leave the writer as it was."""
    top = (1 << 64) - 1
    log_id = writer.log_id
    answers, ended = on_stream(
        sidecar.stub,
        [
            pb.SessionRequest(id=top, last_appended_sqn=pb.LastAppendedSqnRequest(log_id=log_id)),
            pb.SessionRequest(id=1, persist=pb.PersistRequest(log_id=log_id, after=top)),
            pb.SessionRequest(id=2, truncate=pb.TruncateRequest(log_id=log_id, before=top)),
        ],
    )
    assert ended is None and [a.id for a in answers] == [top, 1, 2]
    assert not answers[0].HasField("error")
    assert isinstance(error_of_answer(answers[1]), SqnOutOfRange)
    assert isinstance(error_of_answer(answers[2]), SqnOutOfRange)
    part = pb.KeyGroupChanges(
        key_group=10, count=0xFFFFFFFF, sizes=b"\x01\x00\x00\x00", payload=b"x"
    )
    answers, ended = on_stream(
        sidecar.stub,
        [pb.SessionRequest(id=5, append=pb.AppendRequest(log_id=log_id, changes=[part]))],
    )
    assert ended is None and isinstance(error_of_answer(answers[0]), InvalidArgument)
    assert_writer_still_works(sidecar.client, writer)


def test_stream_waiting_persists_are_bounded_and_all_answered(
    sidecar: Sidecar, writer: ChangelogWriter
) -> None:
    """More persists than may wait at once: the sidecar stops reading until one is
    answered (flow control), and every one is answered, none refused."""
    n = 3 * MAX_WAITING_PERSISTS
    log_id = writer.log_id
    requests = [pb.SessionRequest(id=1, append=_append(log_id, 10, b"once"))]
    requests += [
        pb.SessionRequest(id=2 + i, persist=pb.PersistRequest(log_id=log_id, after=0))
        for i in range(n)
    ]
    answers, ended = on_stream(sidecar.stub, requests, timeout=60)
    assert ended is None
    assert sorted(a.id for a in answers) == list(range(1, n + 2))
    for a in answers[1:]:
        assert [d for _, _, d in read_all(sidecar.client, _handle(a))] == [b"once"]
