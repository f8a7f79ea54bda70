"""A call's changes as one ``PackedParts``: the same contract as repeated ``KeyGroupChanges``.

One real ``dstl-server`` serves the module (with a bystander writer of another
job that must keep every byte after each test). Packed calls are sent raw,
over both transports (``transport``: unary calls, a Session stream): what
they store reads back exactly like the same parts sent one message per key
group, and every malformed packed call gets a typed error, applies nothing and
leaves its writer working. The client sends packed calls to a sidecar that
says it accepts them, and the repeated form when told the sidecar does not.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from dstl_client import ChangelogClient, ChangelogWriter
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import ChangeTooLarge, InvalidArgument, KeyGroupOutOfRange
from dstl_client.core.format import MAX_PARTS_PER_REQUEST
from tests.integration._helpers import (
    Sidecar,
    error_of,
    on_stream,
    read_all,
    refusal,
    sidecar_with_bystander,
)

MAX_CHANGE = 4096
JOB = "job-packed"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    root = tmp_path_factory.mktemp("packed") / "srv"
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


def u32(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def packed_parts(parts: list[tuple[int, list[bytes]]]) -> pb.PackedParts:
    """``parts`` (key group, its changes) in the packed form, as the client sends them."""
    changes = [c for _, cs in parts for c in cs]
    return pb.PackedParts(
        key_groups=u32(*(kg for kg, _ in parts)),
        counts=u32(*(len(cs) for _, cs in parts)),
        sizes=u32(*map(len, changes)),
        payload=b"".join(changes),
    )


def send(sidecar: Sidecar, transport: str, method: str, request: object) -> None:
    """Send ``request`` raw and wait for its answer (it must be accepted)."""
    if transport == "unary":
        getattr(sidecar.stub, method)(request, timeout=20)
        return
    answers, ended = on_stream(sidecar.stub, [stream_request(method, request)])
    assert ended is None and not answers[0].HasField("error"), answers


def stream_request(method: str, request: object) -> pb.SessionRequest:
    if isinstance(request, pb.AppendRequest):
        return pb.SessionRequest(id=1, append=request)
    assert isinstance(request, pb.PersistRequest), method
    return pb.SessionRequest(id=1, persist=request)


def bound_refusal(sidecar: Sidecar, transport: str, request: pb.AppendRequest) -> object:
    """The error of a request refused before decoding: a unary call's, or the one that
    ends a Session stream (its bytes are not read as requests)."""
    if transport == "unary":
        return error_of(sidecar.stub.Append, request)
    answers, ended = on_stream(sidecar.stub, [stream_request("Append", request)])
    assert not answers, answers
    return ended


def assert_nothing_applied_and_still_works(sidecar: Sidecar, w: ChangelogWriter) -> None:
    """The refused call left no change behind, and the writer goes on with good data."""
    w.append(10, b"after")
    h = w.persist_durably(after=0).result(timeout=30)
    assert read_all(sidecar.client, h) == [(10, 0, b"after")]


# ------------------------------------------------------------------ same contract
def test_packed_and_repeated_calls_store_the_same_changes(sidecar: Sidecar, transport: str) -> None:
    parts = [(10, [b"a", b"bb"]), (12, [b"c"]), (19, [b"", b"dddd", b"e" * MAX_CHANGE])]
    read: list[list[tuple[int, int, bytes]]] = []
    with ChangelogClient(sidecar.proc.address, timeout_s=20, transport=transport) as client:
        for form in ("packed", "repeated"):
            w = client.create_writer(job_id=JOB, operator_id=form, key_group_range=(10, 19))
            if form == "packed":
                req = pb.AppendRequest(log_id=w.log_id, packed=packed_parts(parts))
            else:
                req = pb.AppendRequest(
                    log_id=w.log_id,
                    changes=[
                        pb.KeyGroupChanges(
                            key_group=kg,
                            count=len(cs),
                            sizes=u32(*map(len, cs)),
                            payload=b"".join(cs),
                        )
                        for kg, cs in parts
                    ],
                )
            send(sidecar, transport, "Append", req)
            # a persist that carries its own packed changes, applied before it
            persist = pb.PersistRequest(
                log_id=w.log_id, after=0, packed=packed_parts([(11, [b"last"])])
            )
            if form == "repeated":
                persist = pb.PersistRequest(
                    log_id=w.log_id,
                    after=0,
                    changes=[
                        pb.KeyGroupChanges(key_group=11, count=1, sizes=u32(4), payload=b"last")
                    ],
                )
            send(sidecar, transport, "PersistDurably", persist)
            read.append(read_all(client, w.persist_durably(after=0).result(timeout=30)))
            w.close()
    assert read[0] == read[1]
    assert [(kg, d) for kg, _, d in read[0]] == [
        (10, b"a"),
        (10, b"bb"),
        (11, b"last"),
        (12, b"c"),
        (19, b""),
        (19, b"dddd"),
        (19, b"e" * MAX_CHANGE),
    ]


def test_the_client_sends_packed_calls_to_a_sidecar_that_accepts_them(
    sidecar: Sidecar, transport: str
) -> None:
    with ChangelogClient(sidecar.proc.address, timeout_s=20, transport=transport) as client:
        w = client.create_writer(job_id=JOB, operator_id="new", key_group_range=(10, 19))
        assert w.packed  # the sidecar said so in CreateWriter's answer
        old = client.open_writer(
            job_id=JOB,
            log_id=w.log_id,
            key_group_range=(10, 19),
            max_change_bytes=w.max_change_bytes,
            packed=False,  # as for a sidecar that predates PackedParts
        )
        assert not old.packed
        w.append_many([(10, b"one"), (13, b"two")])
        w.flush()
        old.append_many([(14, b"three"), (10, b"four")])
        h = old.persist_durably(after=0).result(timeout=30)
        assert [(kg, d) for kg, _, d in read_all(client, h)] == [
            (10, b"one"),
            (10, b"four"),
            (13, b"two"),
            (14, b"three"),
        ]
        old.close()


# ------------------------------------------------------------------- bad input
BAD = {
    "key groups not whole u32s": (
        pb.PackedParts(key_groups=b"\x0a\x00\x00", counts=u32(1), sizes=u32(1), payload=b"x"),
        InvalidArgument,
        "whole u32s",
    ),
    "a count missing": (
        pb.PackedParts(key_groups=u32(10, 11), counts=u32(1), sizes=u32(1), payload=b"x"),
        InvalidArgument,
        "one count per part",
    ),
    "changes without a key group": (
        pb.PackedParts(sizes=u32(1), payload=b"x"),
        InvalidArgument,
        "without a key group",
    ),
    "counts and sizes disagree": (
        pb.PackedParts(key_groups=u32(10), counts=u32(2), sizes=u32(1), payload=b"x"),
        InvalidArgument,
        "the counts add up to 2 changes, sizes holds 1",
    ),
    "sizes and payload disagree": (
        pb.PackedParts(key_groups=u32(10), counts=u32(1), sizes=u32(3), payload=b"x"),
        InvalidArgument,
        "the sizes add up to 3 bytes, payload holds 1",
    ),
    "a part without changes": (
        pb.PackedParts(key_groups=u32(10, 11), counts=u32(1, 0), sizes=u32(1), payload=b"x"),
        InvalidArgument,
        "key group 11: a part must hold at least one change",
    ),
    "a key group outside the range": (
        pb.PackedParts(key_groups=u32(10, 20), counts=u32(1, 1), sizes=u32(1, 1), payload=b"xy"),
        KeyGroupOutOfRange,
        "key group 20 is outside",
    ),
    "a change over the limit": (
        pb.PackedParts(
            key_groups=u32(10, 12),
            counts=u32(1, 1),
            sizes=u32(1, MAX_CHANGE + 1),
            payload=b"x" * (MAX_CHANGE + 2),
        ),
        ChangeTooLarge,
        f"key group 12: a change of {MAX_CHANGE + 1} bytes exceeds the limit of {MAX_CHANGE}",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("method", ["Append", "PersistDurably"])
def test_a_malformed_packed_call_is_refused_with_a_typed_error(
    sidecar: Sidecar, writer: ChangelogWriter, case: str, method: str
) -> None:
    parts, error, reason = BAD[case]
    if method == "Append":
        req: object = pb.AppendRequest(log_id=writer.log_id, packed=parts)
    else:
        req = pb.PersistRequest(log_id=writer.log_id, after=0, packed=parts)
    err = refusal(sidecar.stub, writer.transport.name, method, req)
    assert type(err) is error, err
    assert reason in err.message
    assert_nothing_applied_and_still_works(sidecar, writer)


def test_a_call_with_both_forms_is_refused(sidecar: Sidecar, writer: ChangelogWriter) -> None:
    req = pb.AppendRequest(
        log_id=writer.log_id,
        changes=[pb.KeyGroupChanges(key_group=10, count=1, sizes=u32(1), payload=b"x")],
        packed=packed_parts([(11, [b"y"])]),
    )
    err = refusal(sidecar.stub, writer.transport.name, "Append", req)
    assert type(err) is InvalidArgument and "not both" in err.message, err
    assert_nothing_applied_and_still_works(sidecar, writer)


def test_packed_parts_count_toward_the_parts_bound_before_decoding(
    sidecar: Sidecar, writer: ChangelogWriter
) -> None:
    n = MAX_PARTS_PER_REQUEST + 1
    parts = pb.PackedParts(
        key_groups=u32(*[10] * n), counts=u32(*[1] * n), sizes=u32(*[1] * n), payload=b"x" * n
    )
    req = pb.AppendRequest(log_id=writer.log_id, packed=parts)
    err = bound_refusal(sidecar, writer.transport.name, req)
    assert isinstance(err, InvalidArgument) and "key-group parts" in err.message, err
    # the two forms of one call count together
    half = MAX_PARTS_PER_REQUEST // 2 + 1
    both = pb.AppendRequest(
        log_id=writer.log_id,
        changes=[pb.KeyGroupChanges(key_group=10, count=1, sizes=u32(1), payload=b"x")] * half,
        packed=pb.PackedParts(
            key_groups=u32(*[10] * half),
            counts=u32(*[1] * half),
            sizes=u32(*[1] * half),
            payload=b"x" * half,
        ),
    )
    err = bound_refusal(sidecar, writer.transport.name, both)
    assert isinstance(err, InvalidArgument) and "key-group parts" in err.message, err
    assert_nothing_applied_and_still_works(sidecar, writer)
