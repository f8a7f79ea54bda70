"""Small requests that decode into a lot: refused on the wire bytes, before any work.

A real ``dstl-server`` process serves the module. Each request shape of the
probe (a real handle padded with millions of empty entries, millions of
empty discard keys, append parts, forwarded sections, a Session message
with millions of parts, a request past its method's byte limit) is sent raw
on the wire. Each must get a typed error at once while the server's RSS,
sampled throughout the call, stays within a few tens of MiB of where it
was; a bystander writer of another job must still write and read back
afterwards. Before the bounds, the padded handle alone stalled the sidecar
for seconds and took hundreds of MiB.

Also here: a forwarded section whose body does not verify never joins an
object, and calls refused for another job's token do not keep a writer
from expiring.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest

from dstl_client import ChangelogClient, ChangelogHandle
from dstl_client._status import to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    DstlError,
    InvalidArgument,
    InvalidHandle,
    LogNotFound,
    PermissionDenied,
    RequestTooLarge,
    WriterFailed,
)
from dstl_client.core.format import Changeset, encode_log_section, pack_changes
from dstl_client.core.handle import MAX_ENTRIES
from dstl_server.auth import Authenticator
from dstl_server.request_bounds import MAX_DISCARD_KEYS, MAX_FORWARD_SECTIONS
from dstl_server.testing import ServerProcess
from tests.integration._helpers import (
    Sidecar,
    error_of,
    object_files,
    on_stream,
    poll_until,
    sidecar_with_bystander,
)

JOB = "job-bounds"
MiB = 1 << 20
#: RSS a refused request may add to the server while it is handled (gRPC holds its
#: bytes, a few MiB; the allocator's slack). Each shape took 76 to 600 MiB before.
RSS_GROWTH_BOUND = 40 * MiB
#: a refusal arrives within this (it took 6 s and more for the padded handle)
ANSWER_WITHIN_S = 5.0
#: the wire encoding of one empty element of a repeated message/bytes/string field
EMPTY = {field: bytes([field << 3 | 2, 0]) for field in (2, 3, 8)}


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(no: int, data: bytes) -> bytes:
    return _varint(no << 3 | 2) + _varint(len(data)) + data


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    root = tmp_path_factory.mktemp("bounds") / "srv"
    with sidecar_with_bystander(root, []) as sidecar:
        yield sidecar


@pytest.fixture(autouse=True)
def bystander_survives(sidecar: Sidecar) -> Iterator[None]:
    yield
    sidecar.bystander.assert_intact()


@pytest.fixture(scope="module")
def real_handle(sidecar: Sidecar) -> pb.Handle:
    """A real persisted handle of JOB (what the probe padded)."""
    w = sidecar.client.create_writer(job_id=JOB, operator_id="op", key_group_range=(0, 7))
    w.append(1, b"real change")
    handle = w.persist_durably(after=0).result(timeout=30)
    w.close()
    return handle.to_proto()


class RssPeak:
    """The highest RSS of a process while the ``with`` block runs (sampled every 5 ms)."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.start = int(self._proc.memory_info().rss)
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, int(self._proc.memory_info().rss))

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.peak = max(self.peak, int(self._proc.memory_info().rss))

    @property
    def growth(self) -> int:
        return self.peak - self.start


def refusal(sidecar: Sidecar, method: str, request: bytes) -> tuple[DstlError, float, int]:
    """Send raw ``request`` bytes to ``method``: its typed error, seconds, peak RSS growth."""
    path = f"/dstl.v1.Changelog/{method}"
    if method == "ReadChanges":
        call = sidecar.channel.unary_stream(path)
    else:
        call = sidecar.channel.unary_unary(path)
    assert sidecar.proc.proc is not None
    with RssPeak(sidecar.proc.proc.pid) as rss:
        started = time.monotonic()
        err = error_of(call, request, timeout=120)
        elapsed = time.monotonic() - started
    return err, elapsed, rss.growth


def assert_bounded(err: DstlError, elapsed: float, growth: int, cls: type[DstlError]) -> None:
    """Refused at once, with a typed error, and without the server's memory following the
    numbers in the request."""
    assert growth < RSS_GROWTH_BOUND, f"RSS grew {growth / MiB:.0f} MiB for a refused request"
    assert elapsed < ANSWER_WITHIN_S, f"refused after {elapsed:.1f}s"
    assert isinstance(err, cls), f"{type(err).__name__}: {err.message}"
    assert "refused before decoding" in err.message, err.message


# ----------------------------------------------------------------- amplification shapes
def test_a_real_handle_padded_with_empty_entries_is_refused_before_decoding(
    sidecar: Sidecar, real_handle: pb.Handle
) -> None:
    padding = EMPTY[8] * 4_000_000  # 7.6 MiB: the probe's request
    handle = real_handle.SerializeToString() + padding
    err, elapsed, growth = refusal(sidecar, "ReadChanges", _field(1, handle))
    assert_bounded(err, elapsed, growth, InvalidHandle)
    assert f"more than {MAX_ENTRIES} handle entries" in err.message
    # the same handle unpadded still reads
    got = list(sidecar.client.read_changes(ChangelogHandle.from_proto(real_handle)))
    assert [d for _, _, d in got] == [b"real change"]


def test_a_handle_past_the_read_limit_is_refused_by_its_size(
    sidecar: Sidecar, real_handle: pb.Handle
) -> None:
    # within gRPC's 64 MiB message limit, past ReadChanges' own 24 MiB
    handle = real_handle.SerializeToString() + _field(2, b"j" * (25 * MiB))  # job_id
    err, elapsed, growth = refusal(sidecar, "ReadChanges", _field(1, handle))
    assert isinstance(err, RequestTooLarge) and "ReadChanges" in err.message
    assert growth < 3 * 25 * MiB  # gRPC holds the bytes; nothing is decoded
    assert elapsed < ANSWER_WITHIN_S


def test_a_packed_key_group_list_is_counted_before_decoding(
    sidecar: Sidecar, real_handle: pb.Handle
) -> None:
    many = _field(2, b"\x01" * 8_000_000)  # 8 M key groups, one byte each
    err, elapsed, growth = refusal(
        sidecar, "ReadChanges", _field(1, real_handle.SerializeToString()) + many
    )
    assert_bounded(err, elapsed, growth, InvalidArgument)
    assert "key groups" in err.message


def test_millions_of_empty_discard_keys_are_refused_by_size(sidecar: Sidecar) -> None:
    request = _field(1, JOB.encode()) + EMPTY[2] * 2_000_000  # the probe's 2 M keys
    err, elapsed, growth = refusal(sidecar, "DiscardObjects", request)
    assert isinstance(err, RequestTooLarge) and "DiscardObjects" in err.message
    assert growth < RSS_GROWTH_BOUND and elapsed < ANSWER_WITHIN_S


def test_too_many_discard_keys_within_the_size_are_counted_first(sidecar: Sidecar) -> None:
    request = _field(1, JOB.encode()) + EMPTY[2] * 900_000  # 1.8 MB, below 2 MiB
    err, elapsed, growth = refusal(sidecar, "DiscardObjects", request)
    assert_bounded(err, elapsed, growth, InvalidArgument)
    assert f"more than {MAX_DISCARD_KEYS} object keys" in err.message


@pytest.mark.parametrize(("method", "field"), [("Append", 2), ("PersistDurably", 3)])
def test_millions_of_empty_parts_are_refused_before_decoding(
    sidecar: Sidecar, method: str, field: int
) -> None:
    log_id = sidecar.client.create_writer(
        job_id=JOB, operator_id="parts", key_group_range=(0, 7)
    ).log_id
    request = _field(1, log_id.encode()) + EMPTY[field] * 4_000_000
    err, elapsed, growth = refusal(sidecar, method, request)
    assert_bounded(err, elapsed, growth, InvalidArgument)
    assert "key-group parts" in err.message


def test_an_ordered_call_refused_before_decoding_still_takes_its_turn(sidecar: Sidecar) -> None:
    """Its seq is read without its parts: the next call of the session is not left waiting
    for it (CallLost after the timeout); it is refused as the session failed (the call may
    have carried changes that no handle may miss)."""
    log_id = sidecar.client.create_writer(
        job_id=JOB, operator_id="ordered", key_group_range=(0, 7)
    ).log_id
    session = b"\x70" + _varint(12345) + b"\x78"  # session=12345, then seq's tag
    first = _field(1, log_id.encode()) + EMPTY[2] * 4_000_000 + session + _varint(1)
    err, elapsed, growth = refusal(sidecar, "Append", first)
    assert_bounded(err, elapsed, growth, InvalidArgument)
    started = time.monotonic()
    err = error_of(
        sidecar.stub.Append,
        pb.AppendRequest(
            log_id=log_id,
            changes=[pb.KeyGroupChanges(key_group=1, count=1, sizes=b"\x01\0\0\0", payload=b"x")],
            session=12345,
            seq=2,
        ),
    )
    assert isinstance(err, WriterFailed) and "call 1 " in err.message, err
    assert time.monotonic() - started < ANSWER_WITHIN_S


def test_a_session_message_of_millions_of_parts_ends_the_stream_at_once(
    sidecar: Sidecar,
) -> None:
    log_id = sidecar.client.create_writer(
        job_id=JOB, operator_id="stream", key_group_range=(0, 7)
    ).log_id
    append = _field(1, log_id.encode()) + EMPTY[2] * 4_000_000
    raw = b"\x08\x01" + _field(2, append)  # id=1, append=...
    call = sidecar.channel.stream_stream("/dstl.v1.Changelog/Session")
    assert sidecar.proc.proc is not None
    with RssPeak(sidecar.proc.proc.pid) as rss:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter([raw]), timeout=120))
        elapsed = time.monotonic() - started
    assert_bounded(to_dstl_error(info.value), elapsed, rss.growth, InvalidArgument)
    # a well-formed stream of the same writer goes on
    ok = pb.SessionRequest(
        id=2,
        append=pb.AppendRequest(
            log_id=log_id,
            changes=[pb.KeyGroupChanges(key_group=1, count=1, sizes=b"\x01\0\0\0", payload=b"x")],
        ),
    )
    answers, ended = on_stream(sidecar.stub, [ok])
    assert ended is None and [a.id for a in answers] == [2] and not answers[0].HasField("error")


def test_millions_of_empty_forwarded_sections_are_refused_before_decoding(
    sidecar: Sidecar,
) -> None:
    request = _field(1, JOB.encode()) + EMPTY[2] * 4_000_000
    err, elapsed, growth = refusal(sidecar, "Forward", request)
    assert_bounded(err, elapsed, growth, InvalidArgument)
    assert f"more than {MAX_FORWARD_SECTIONS} sections" in err.message


def test_a_control_call_past_its_limit_is_refused_by_size(sidecar: Sidecar) -> None:
    request = _field(1, b"x" * (3 * MiB))  # a CreateWriter job id of 3 MiB
    err = error_of(sidecar.channel.unary_unary("/dstl.v1.Changelog/CreateWriter"), request)
    assert isinstance(err, RequestTooLarge) and "at most" in err.message


# ----------------------------------------------------------------- forwarded sections
def _section(payload: bytes) -> bytes:
    sec = encode_log_section(
        bytes.fromhex("ab" * 16), [Changeset(5, {3: [pack_changes([payload])]})], end_sqn=6
    )
    return b"".join(sec.chunks)


def test_a_forwarded_section_with_a_corrupt_body_never_lands_in_an_object(
    sidecar: Sidecar,
) -> None:
    job = "job-forwarded"
    good = _section(b"forwarded change " * 8)
    bad = bytearray(good)
    bad[-10] ^= 0x01  # a payload byte: the header (and its checksum) are intact
    forward = sidecar.channel.unary_unary(
        "/dstl.v1.Changelog/Forward",
        request_serializer=pb.ForwardRequest.SerializeToString,
        response_deserializer=pb.ForwardResponse.FromString,
    )
    err = error_of(forward, pb.ForwardRequest(job_id=job, sections=[good, bytes(bad)]))
    assert isinstance(err, InvalidArgument) and "checksum" in err.message
    assert not [
        p for p in object_files(sidecar.root) if p.relative_to(sidecar.root).parts[1] == job
    ]
    # the good section alone is taken, and lands in an object byte for byte
    answer = forward(pb.ForwardRequest(job_id=job, sections=[good]), timeout=30)
    stored = sidecar.root / "objects" / answer.object_key
    (placed,) = answer.placements
    assert stored.read_bytes()[placed.offset : placed.offset + placed.length] == good
    assert bytes(bad) not in stored.read_bytes()


# ----------------------------------------------------------------- idle timers
SECRET = "Zq3mR8vT1xK6pW9nB2cJ5hL0fD7sGa4y"


@pytest.mark.slow
def test_calls_refused_for_another_jobs_token_do_not_keep_a_writer_alive(
    tmp_path: Path,
) -> None:
    auth = Authenticator(SECRET)
    args = ["--writer-idle-timeout-s", "1.0"]
    with (
        ServerProcess(tmp_path / "srv", extra_args=args, env={"DSTL_AUTH_SECRET": SECRET}) as proc,
        ChangelogClient(proc.address, token=auth.job_token("jobA"), timeout_s=20) as owner,
        grpc.insecure_channel(proc.address) as channel,
    ):
        victim = owner.create_writer(job_id="jobA", operator_id="op", key_group_range=(0, 0))
        intruder = (("authorization", f"Bearer {auth.job_token('jobB')}"),)
        last = channel.unary_unary(
            "/dstl.v1.Changelog/LastAppendedSqn",
            request_serializer=pb.LastAppendedSqnRequest.SerializeToString,
            response_deserializer=pb.SqnResponse.FromString,
        )
        session = channel.stream_stream(
            "/dstl.v1.Changelog/Session",
            request_serializer=pb.SessionRequest.SerializeToString,
            response_deserializer=pb.SessionResponse.FromString,
        )
        probe = pb.LastAppendedSqnRequest(log_id=victim.log_id)

        def expired_while_refused() -> bool:
            if proc.scrape_metrics()["dstl_writers_expired_total"] == 1:
                return True
            # refused: another job's writer (not found once it expired meanwhile)
            with pytest.raises(grpc.RpcError) as info:
                last(probe, timeout=5, metadata=intruder)
            assert isinstance(to_dstl_error(info.value), PermissionDenied | LogNotFound)
            answers = list(
                session(
                    iter([pb.SessionRequest(id=1, last_appended_sqn=probe)]),
                    timeout=5,
                    metadata=intruder,
                )
            )
            assert len(answers) == 1
            assert answers[0].error.kind in ("permission_denied", "log_not_found")
            return False

        poll_until(expired_while_refused, "the writer expired while others' calls were refused")
