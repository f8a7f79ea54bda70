"""PackedCall: a call's packed parts checked and split as the repeated form's, or refused typed."""

from __future__ import annotations

import struct
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import DstlError
from dstl_client.core.format import (
    CHAIN_CRC_PIECE_BYTES,
    Changeset,
    PackedChanges,
    PackedGroups,
    encode_log_section,
    parse_kg_block,
    parse_log_header,
)
from dstl_server.log import CheckedParts, WriterLog
from dstl_server.packed_call import PackedCall
from dstl_server.parts import CallParts, charge_of

LIMIT = 64


def writer() -> WriterLog:
    return WriterLog("job", "op", (10, 19))


def u32(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def listed(checked: CheckedParts) -> list[tuple[int, PackedChanges]]:
    """The checked parts in call order, whichever form holds them."""
    if isinstance(checked.parts, PackedGroups):
        return checked.parts.split()
    return checked.parts


def packed_call(parts: list[tuple[int, list[bytes]]]) -> PackedCall:
    changes = [c for _, cs in parts for c in cs]
    return PackedCall(
        pb.PackedParts(
            key_groups=u32([kg for kg, _ in parts]),
            counts=u32([len(cs) for _, cs in parts]),
            sizes=u32([len(c) for c in changes]),
            payload=b"".join(changes),
        )
    )


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
    packed = packed_call(parts)
    repeated = [
        pb.KeyGroupChanges(
            key_group=kg, count=len(cs), sizes=u32([len(c) for c in cs]), payload=b"".join(cs)
        )
        for kg, cs in parts
    ]
    assert charge_of(packed) == charge_of(repeated)
    from_packed = writer().check_parts(packed, LIMIT)
    from_repeated = writer().check_parts(repeated, LIMIT)
    assert listed(from_packed) == listed(from_repeated)
    assert (from_packed.nbytes, from_packed.count, from_packed.charge) == (
        from_repeated.nbytes,
        from_repeated.count,
        from_repeated.charge,
    )
    # key groups strictly ascending (what clients send) stay packed; others are split
    kgs = [kg for kg, _ in parts]
    ascending = all(a < b for a, b in pairwise(kgs))
    assert isinstance(from_packed.parts, PackedGroups) == ascending


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
    parts = listed(checked)
    kgs = [kg for kg, _ in parts]
    assert u32(kgs) == key_groups
    assert u32([p.count for _, p in parts]) == counts
    assert b"".join(p.sizes for _, p in parts) == sizes
    assert b"".join(p.payload for _, p in parts) == payload
    for kg, p in parts:
        assert 10 <= kg <= 19 and p.count >= 1
        got = struct.unpack(f"<{p.count}I", p.sizes)
        assert sum(got) == len(p.payload) and max(got) <= LIMIT
    assert (checked.nbytes, checked.count) == (len(sizes) + len(payload), len(sizes) // 4)


ascending_parts = st.dictionaries(
    st.integers(10, 19), st.lists(st.binary(max_size=LIMIT), min_size=1, max_size=5), min_size=1
).map(lambda by_kg: sorted(by_kg.items()))


@settings(max_examples=100)
@given(ascending_parts, st.integers(0, 2**40))
def test_a_packed_changeset_encodes_to_the_bytes_of_its_split_parts(
    parts: list[tuple[int, list[bytes]]], sqn: int
) -> None:
    checked = writer().check_parts(packed_call(parts), LIMIT)
    groups = checked.parts
    assert isinstance(groups, PackedGroups)
    split = {kg: [part] for kg, part in listed(checked)}
    groups.seal(sqn)  # as the writer log does when they become its changeset
    assert {kg: list(ps) for kg, ps in groups.items()} == split  # read as a mapping
    assert groups.split() == [(kg, part) for kg, [part] in split.items()]
    log_id = bytes(range(16))
    section = encode_log_section(log_id, [Changeset(sqn, groups)], sqn + 1)
    assert section.chunks == encode_log_section(log_id, [Changeset(sqn, split)], sqn + 1).chunks
    data = b"".join(section.chunks)
    index = parse_log_header(data, len(data))
    read = {
        kg: [c for view in parse_kg_block(kg, data[off : off + n]) for c in view.changes()]
        for kg, (off, n) in index.key_groups.items()
    }
    assert read == dict(parts)


@given(ascending_parts, parts_strategy, st.booleans())
def test_a_packed_call_then_another_make_the_changeset_the_repeated_forms_make(
    first: list[tuple[int, list[bytes]]], second: list[tuple[int, list[bytes]]], packed: bool
) -> None:
    def repeated(parts: list[tuple[int, list[bytes]]]) -> list[pb.KeyGroupChanges]:
        return [
            pb.KeyGroupChanges(
                key_group=kg, count=len(cs), sizes=u32([len(c) for c in cs]), payload=b"".join(cs)
            )
            for kg, cs in parts
        ]

    def changeset(
        log: WriterLog, calls: list[CallParts]
    ) -> tuple[dict[int, list[PackedChanges]], int]:
        for call in calls:
            checked = log.check_parts(call, LIMIT)
            log.append_parts(checked.parts, checked.nbytes)
        held = log.active_bytes
        log.rollover()
        (cs,) = log.not_uploaded.values()
        return {kg: list(ps) for kg, ps in cs.groups.items()}, held

    second_call: CallParts = packed_call(second) if packed else repeated(second)
    got = changeset(writer(), [packed_call(first), second_call])
    assert got == changeset(writer(), [repeated(first), repeated(second)])


def test_packed_changes_are_sealed_once_under_their_sqn() -> None:
    checked = writer().check_parts(packed_call([(10, [b"a", b"bc"]), (12, [b"d"])]), LIMIT)
    groups = checked.parts
    assert isinstance(groups, PackedGroups)
    with pytest.raises(ValueError, match="sealed under SQN -1"):
        groups.entries(7)  # not sealed: no entries yet
    with pytest.raises(ValueError, match="once sealed"):
        groups[10]  # a mapping once it is a changeset
    groups.seal(7)
    with pytest.raises(ValueError, match="already sealed under SQN 7"):
        groups.seal(8)
    with pytest.raises(ValueError, match="sealed under SQN 7, not 8"):
        groups.entries(8)
    with pytest.raises(KeyError):
        groups[11]
    assert [p.payload for p in groups[10]] == [b"abc"]


def test_a_packed_call_of_large_parts_is_split_to_keep_their_own_bytes() -> None:
    big = [b"x" * (6 * CHAIN_CRC_PIECE_BYTES)]  # parts of 3 pieces averaging over 4 KiB
    log = WriterLog("job", "op", (10, 19))
    checked = log.check_parts(packed_call([(10, big), (11, [b"y"])]), 1 << 20)
    assert isinstance(checked.parts, list)
    assert [(kg, p.payload) for kg, p in checked.parts] == [(10, big[0]), (11, b"y")]
