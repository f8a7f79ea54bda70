"""PackedCall: a call's packed parts checked and split as the repeated form's, or refused typed."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import DstlError
from dstl_server.log import WriterLog
from dstl_server.packed_call import PackedCall
from dstl_server.parts import charge_of

LIMIT = 64


def writer() -> WriterLog:
    return WriterLog("job", "op", (10, 19))


def u32(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


parts_strategy = st.lists(
    st.tuples(st.integers(10, 19), st.lists(st.binary(max_size=LIMIT), min_size=1, max_size=5)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=100)
@given(parts_strategy)
def test_a_packed_call_checks_to_the_same_parts_and_charge_as_the_repeated_form(
    parts: list[tuple[int, list[bytes]]],
) -> None:
    changes = [c for _, cs in parts for c in cs]
    packed = PackedCall(
        pb.PackedParts(
            key_groups=u32([kg for kg, _ in parts]),
            counts=u32([len(cs) for _, cs in parts]),
            sizes=u32([len(c) for c in changes]),
            payload=b"".join(changes),
        )
    )
    repeated = [
        pb.KeyGroupChanges(
            key_group=kg, count=len(cs), sizes=u32([len(c) for c in cs]), payload=b"".join(cs)
        )
        for kg, cs in parts
    ]
    assert charge_of(packed) == charge_of(repeated)
    assert writer().check_parts(packed, LIMIT) == writer().check_parts(repeated, LIMIT)


@settings(max_examples=300)
@given(
    st.binary(max_size=24),
    st.binary(max_size=24),
    st.binary(max_size=40),
    st.binary(max_size=40),
)
def test_arbitrary_packed_bytes_are_split_exactly_or_refused_typed(
    key_groups: bytes, counts: bytes, sizes: bytes, payload: bytes
) -> None:
    msg = pb.PackedParts(key_groups=key_groups, counts=counts, sizes=sizes, payload=payload)
    try:
        checked = writer().check_parts(PackedCall(msg), LIMIT)
    except DstlError:
        return  # a typed refusal (InvalidArgument, KeyGroupOutOfRange, ChangeTooLarge)
    # accepted: the parts are the packed bytes, split without loss, each well formed
    kgs = [kg for kg, _ in checked.parts]
    assert u32(kgs) == key_groups
    assert u32([p.count for _, p in checked.parts]) == counts
    assert b"".join(p.sizes for _, p in checked.parts) == sizes
    assert b"".join(p.payload for _, p in checked.parts) == payload
    for kg, p in checked.parts:
        assert 10 <= kg <= 19 and p.count >= 1
        got = struct.unpack(f"<{p.count}I", p.sizes)
        assert sum(got) == len(p.payload) and max(got) <= LIMIT
    assert (checked.nbytes, checked.count) == (len(sizes) + len(payload), len(sizes) // 4)
