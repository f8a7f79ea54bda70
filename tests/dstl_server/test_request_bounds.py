"""Request bounds on the wire bytes (dstl_server.request_bounds), without a server."""

from __future__ import annotations

import pytest

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    DstlError,
    InvalidArgument,
    InvalidHandle,
    RequestTooLarge,
)
from dstl_client.core.format import MAX_PARTS_PER_REQUEST
from dstl_client.core.handle import MAX_ENTRIES
from dstl_server.request_bounds import (
    MAX_DISCARD_KEYS,
    MAX_FORWARD_SECTIONS,
    MAX_READ_KEY_GROUPS,
    SHAPES,
    check_request,
    method_limits,
)
from dstl_server.settings import ServerSettings

BIG = 1 << 30
KEY = "job/ab/" + "c" * 32 + ".dstl"


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def part(kg: int = 1) -> pb.KeyGroupChanges:
    return pb.KeyGroupChanges(key_group=kg, count=1, sizes=b"\x01\0\0\0", payload=b"x")


def entry(i: int) -> pb.HandleEntry:
    return pb.HandleEntry(object_key=KEY, offset=i, length=1, first_sqn=i, end_sqn=i + 1)


def handle(n: int) -> pb.Handle:
    return pb.Handle(format_version=1, job_id="job", log_id="0" * 32, entries=map(entry, range(n)))


#: (method, a request at its list's limit, the same one element over it, the error)
AT_AND_OVER: list[tuple[str, bytes, bytes, type[DstlError]]] = [
    (
        "Append",
        pb.AppendRequest(log_id="l", changes=[part()] * MAX_PARTS_PER_REQUEST).SerializeToString(),
        pb.AppendRequest(
            log_id="l", changes=[part()] * (MAX_PARTS_PER_REQUEST + 1)
        ).SerializeToString(),
        InvalidArgument,
    ),
    (
        "PersistDurably",
        pb.PersistRequest(log_id="l", changes=[part()] * MAX_PARTS_PER_REQUEST).SerializeToString(),
        pb.PersistRequest(
            log_id="l", changes=[part()] * (MAX_PARTS_PER_REQUEST + 1)
        ).SerializeToString(),
        InvalidArgument,
    ),
    (
        "Session",
        pb.SessionRequest(
            id=1, persist=pb.PersistRequest(changes=[part()] * MAX_PARTS_PER_REQUEST)
        ).SerializeToString(),
        pb.SessionRequest(
            id=1, persist=pb.PersistRequest(changes=[part()] * (MAX_PARTS_PER_REQUEST + 1))
        ).SerializeToString(),
        InvalidArgument,
    ),
    (
        "ReadChanges",
        pb.ReadChangesRequest(handle=handle(MAX_ENTRIES)).SerializeToString(),
        pb.ReadChangesRequest(handle=handle(MAX_ENTRIES + 1)).SerializeToString(),
        InvalidHandle,
    ),
    (
        "ReadChanges",
        pb.ReadChangesRequest(key_groups=[1 << 20] * MAX_READ_KEY_GROUPS).SerializeToString(),
        pb.ReadChangesRequest(key_groups=[1] * (MAX_READ_KEY_GROUPS + 1)).SerializeToString(),
        InvalidArgument,
    ),
    (
        "DiscardObjects",
        pb.DiscardObjectsRequest(
            job_id="j", object_keys=[KEY] * MAX_DISCARD_KEYS
        ).SerializeToString(),
        pb.DiscardObjectsRequest(
            job_id="j", object_keys=[""] * (MAX_DISCARD_KEYS + 1)
        ).SerializeToString(),
        InvalidArgument,
    ),
    (
        "Forward",
        pb.ForwardRequest(job_id="j", sections=[b"s"] * MAX_FORWARD_SECTIONS).SerializeToString(),
        pb.ForwardRequest(
            job_id="j", sections=[b""] * (MAX_FORWARD_SECTIONS + 1)
        ).SerializeToString(),
        InvalidArgument,
    ),
]


@pytest.mark.parametrize(("method", "at", "over", "error"), AT_AND_OVER)
def test_a_list_at_its_limit_passes_and_one_more_is_refused(
    method: str, at: bytes, over: bytes, error: type[DstlError]
) -> None:
    check_request(method, at, BIG)
    with pytest.raises(error, match="refused before decoding") as info:
        check_request(method, over, BIG)
    assert type(info.value) is error


def test_every_occurrence_of_a_merged_message_counts() -> None:
    """Protobuf merges repeated occurrences of a message field: their lists add up."""
    half = pb.ReadChangesRequest(handle=handle(MAX_ENTRIES // 2 + 1)).SerializeToString()
    check_request("ReadChanges", half, BIG)
    with pytest.raises(InvalidHandle):
        check_request("ReadChanges", half + half, BIG)
    append = pb.SessionRequest(
        append=pb.AppendRequest(changes=[part()] * (MAX_PARTS_PER_REQUEST // 2 + 1))
    ).SerializeToString()
    with pytest.raises(InvalidArgument, match="key-group parts"):
        check_request("Session", append + append, BIG)


def test_packed_and_unpacked_key_groups_count_alike() -> None:
    packed = b"\x12" + varint(MAX_READ_KEY_GROUPS + 1) + b"\x01" * (MAX_READ_KEY_GROUPS + 1)
    unpacked = b"\x10\x01" * (MAX_READ_KEY_GROUPS + 1)
    for data in (packed, unpacked):
        with pytest.raises(InvalidArgument, match="key groups"):
            check_request("ReadChanges", data, BIG)


def test_a_request_over_its_bytes_is_refused_before_it_is_read() -> None:
    with pytest.raises(RequestTooLarge, match=r"1001 bytes.*at most 1000 for CreateWriter"):
        check_request("CreateWriter", b"\xff" * 1001, 1000)


def test_fields_beyond_the_lists_are_bounded_too() -> None:
    """Millions of unknown fields are not a way around the counts."""
    data = b"\x78\x00" * 1_000_000  # field 15 (seq) over and over
    with pytest.raises(InvalidArgument, match="too many fields"):
        check_request("Append", data, BIG)


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a" + varint(40_000) + b"l" * 40_000 + b"\x12\x05ab",  # a length past the end
        b"\x0b" * 40_000,  # wire type 3 (groups): no dstl message has them
        b"\x00\x00" * 20_000,  # field number 0
        b"\x78" + b"\xff" * 40_000,  # a varint that never ends
    ],
)
def test_bytes_that_are_not_protobuf_do_not_decode(data: bytes) -> None:
    with pytest.raises(InvalidArgument, match="do not decode"):
        check_request("Append", data, BIG)


def test_every_method_has_a_limit_that_fits_it() -> None:
    methods = [m.name for m in pb.DESCRIPTOR.services_by_name["Changelog"].methods]
    assert set(SHAPES) <= set(methods)
    s = ServerSettings()
    limits = method_limits(
        methods,
        max_request=s.max_request_bytes,
        max_read=s.max_read_request_bytes,
        max_control=s.max_control_request_bytes,
    )
    assert limits["Append"] == limits["Session"] == limits["Forward"] == s.max_request_bytes
    assert limits["ReadChanges"] == s.max_read_request_bytes < s.max_request_bytes
    assert limits["CreateWriter"] == limits["DiscardObjects"] == s.max_control_request_bytes
    # any valid handle fits (100,000 entries, longest job ids), and 10,000 discard keys
    longest = "j" * 128
    biggest = pb.Handle(
        format_version=1,
        job_id=longest,
        log_id="f" * 32,
        first_key_group=(1 << 24) - 1,
        last_key_group=(1 << 24) - 1,
        from_sqn=(1 << 63) - 1,
        to_sqn=(1 << 63) - 1,
        entries=[
            pb.HandleEntry(
                object_key=f"{longest}/ab/{'c' * 32}.dstl",
                offset=1 << 40,
                length=1 << 34,
                first_sqn=(1 << 63) - 2,
                end_sqn=(1 << 63) - 1,
            )
        ]
        * MAX_ENTRIES,
    )
    request = pb.ReadChangesRequest(handle=biggest, key_groups=[(1 << 24) - 1] * 32768)
    check_request("ReadChanges", request.SerializeToString(), limits["ReadChanges"])
    discard = pb.DiscardObjectsRequest(
        job_id=longest, object_keys=[f"{longest}/ab/{'c' * 32}.dstl"] * MAX_DISCARD_KEYS
    )
    check_request("DiscardObjects", discard.SerializeToString(), limits["DiscardObjects"])
    # a small limit of max_request_bytes caps every method's
    small = method_limits(methods, max_request=1 << 20, max_read=BIG, max_control=BIG)
    assert set(small.values()) == {1 << 20}


def test_parts_of_every_length_count_and_a_cut_length_does_not_decode() -> None:
    """Part lengths of one, two and three varint bytes are read alike (the usual one of
    two bytes inline); a length cut off by the message's end does not decode."""
    sized = [pb.KeyGroupChanges(key_group=1, payload=b"p" * n) for n in (125, 126, 300, 20_000)]
    at = [part()] * (MAX_PARTS_PER_REQUEST - len(sized)) + sized
    check_request("Append", pb.AppendRequest(changes=at).SerializeToString(), BIG)
    over = pb.AppendRequest(changes=[*at, part()]).SerializeToString()
    with pytest.raises(InvalidArgument, match="key-group parts"):
        check_request("Append", over, BIG)
    ok = pb.AppendRequest(changes=[sized[2]] * 200).SerializeToString()
    for cut in (b"\x12\x80", b"\x12\xac\x02"):  # a length past the end, two bytes
        with pytest.raises(InvalidArgument, match="do not decode"):
            check_request("Append", ok + cut, BIG)
