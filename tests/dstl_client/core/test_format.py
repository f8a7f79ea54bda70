"""The object format: roundtrips, corruption detection, self-contained sections."""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client.core import format as format_module
from dstl_client.core.errors import CorruptObject
from dstl_client.core.format import (
    FORMAT_VERSION,
    OBJECT_HEADER_SIZE,
    BuiltObject,
    Changeset,
    ChangesetView,
    EncodedSection,
    PackedChanges,
    build_object,
    check_packed,
    crc32c,
    encode_log_section,
    log_header_length,
    pack_changes,
    parse_kg_block,
    parse_log_header,
    parse_object,
    split_changes,
    verify_object,
)

#: one writer's changesets: sqn -> key group -> list of changes
LogSpec = Mapping[int, Mapping[int, Sequence[bytes]]]
Decoded = dict[tuple[int, int], list[bytes]]

LOG_A = bytes(range(16))
LOG_B = bytes(range(16, 32))
LOG_C = b"\xcc" * 16

SPECS: dict[bytes, LogSpec] = {
    LOG_A: {
        0: {0: [b"a0", b"a00"], 3: [b"a3"]},
        1: {3: [b"a3-1", b""], 7: [b"x" * 300]},
        4: {0: [b"late"]},
    },
    LOG_B: {5: {1: [b"only one"]}},
    LOG_C: {
        10: {2: [bytes([i]) * i for i in range(1, 20)]},
        11: {2: [b"y"], 9: [b"z"]},
    },
}
END_SQN = {LOG_A: 6, LOG_B: 6, LOG_C: 12}


def changesets(spec: LogSpec, split_parts: bool = False) -> list[Changeset]:
    """Changesets of a spec; ``split_parts`` stores each change as its own part."""
    out = []
    for sqn in sorted(spec):
        groups: dict[int, list[PackedChanges]] = {}
        for kg, changes in spec[sqn].items():
            if split_parts:
                groups[kg] = [pack_changes([c]) for c in changes]
            else:
                groups[kg] = [pack_changes(changes)]
        out.append(Changeset(sqn, groups))
    return out


def expected(spec: LogSpec) -> Decoded:
    return {(kg, sqn): list(ch) for sqn, groups in spec.items() for kg, ch in groups.items()}


def section(log_id: bytes, split_parts: bool = False) -> EncodedSection:
    return encode_log_section(log_id, changesets(SPECS[log_id], split_parts), END_SQN[log_id])


def build(*log_ids: bytes) -> BuiltObject:
    return build_object(section(lid) for lid in log_ids)


def decode_section(sec: bytes | memoryview) -> tuple[bytes, int, int, Decoded]:
    hdr = parse_log_header(sec, len(sec))
    out: Decoded = {}
    order = []
    for kg, (off, length) in hdr.key_groups.items():
        for view in parse_kg_block(kg, memoryview(sec)[off : off + length]):
            out[(kg, view.sqn)] = view.changes()
            order.append((kg, view.sqn))
    assert order == sorted(order), "key groups ascending, SQNs ascending inside one"
    return hdr.log_id, hdr.first_sqn, hdr.end_sqn, out


def decode_object(data: bytes) -> dict[bytes, Decoded]:
    index = verify_object(data)
    out = {}
    for log_id, (off, length) in index.sections.items():
        sec_log, _, _, decoded = decode_section(data[off : off + length])
        assert sec_log == log_id
        out[log_id] = decoded
    return out


# ------------------------------------------------------------------ roundtrip


def test_roundtrip_multi_log_multi_kg_multi_changeset() -> None:
    built = build(LOG_A, LOG_B, LOG_C)
    assert decode_object(built.data) == {lid: expected(SPECS[lid]) for lid in SPECS}
    index = parse_object(built.data)
    assert index.version == FORMAT_VERSION
    assert list(index.sections.values()) == built.placements
    assert built.placements[0][0] == OBJECT_HEADER_SIZE
    # sections are contiguous, in the order they were added
    for (o1, l1), (o2, _) in zip(built.placements, built.placements[1:], strict=False):
        assert o1 + l1 == o2


def test_section_header_fields() -> None:
    built = build(LOG_A)
    off, length = built.placements[0]
    sec = built.data[off : off + length]
    hdr = parse_log_header(sec, length)
    assert (hdr.log_id, hdr.first_sqn, hdr.end_sqn) == (LOG_A, 0, 6)
    assert sorted(hdr.key_groups) == [0, 3, 7]
    assert log_header_length(sec) == hdr.header_length
    # one key group's bytes are one contiguous range: readable on their own
    koff, klen = hdr.key_groups[3]
    views = list(parse_kg_block(3, sec[koff : koff + klen]))
    assert [(v.sqn, v.changes()) for v in views] == [(0, [b"a3"]), (1, [b"a3-1", b""])]


def test_parts_of_one_changeset_are_merged() -> None:
    """Several PackedChanges of one key group (appends) read back as one changeset."""
    split = build_object([section(LOG_C, split_parts=True)])
    whole = build_object([section(LOG_C)])
    assert decode_object(split.data) == decode_object(whole.data)
    assert split.data == whole.data  # the encoding does not depend on how appends were cut


def test_encoding_is_deterministic() -> None:
    assert build(LOG_A, LOG_B).data == build(LOG_A, LOG_B).data


def test_empty_object_has_no_sections() -> None:
    built = build_object([])
    assert parse_object(built.data).sections == {}
    assert verify_object(built.data).sections == {}


def test_empty_key_group_change_list_is_kept() -> None:
    sec = encode_log_section(LOG_A, [Changeset(3, {4: [pack_changes([])]})], 4)
    data = build_object([sec]).data
    assert decode_object(data) == {LOG_A: {(4, 3): []}}


@settings(max_examples=60, deadline=None, database=None)
@given(
    st.lists(
        st.dictionaries(
            st.integers(0, 1 << 20),
            st.lists(st.binary(max_size=40), max_size=5),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 1 << 40),
    st.integers(1, 3),
)
def test_roundtrip_property(
    groups_per_cs: list[dict[int, list[bytes]]], first_sqn: int, gap: int
) -> None:
    spec = {first_sqn + i * gap: g for i, g in enumerate(groups_per_cs)}
    end = max(spec) + 1
    data = build_object([encode_log_section(LOG_B, changesets(spec), end)]).data
    assert decode_object(data) == {LOG_B: expected(spec)}


# ------------------------------------------------------------------ encoder input checks


def test_encoder_rejects_bad_input() -> None:
    cs = changesets(SPECS[LOG_A])
    with pytest.raises(ValueError, match="16 bytes"):
        encode_log_section(b"short", cs, 6)
    with pytest.raises(ValueError, match="at least one"):
        encode_log_section(LOG_A, [], 6)
    with pytest.raises(ValueError, match="below end_sqn"):
        encode_log_section(LOG_A, cs, 4)  # SQN 4 is not below end 4
    with pytest.raises(ValueError, match="ordered"):
        encode_log_section(LOG_A, [cs[1], cs[0]], 6)


def test_encoder_rejects_unordered_or_duplicate_sqns() -> None:
    """The encoder never writes an object its own reader refuses."""
    cs = changesets(SPECS[LOG_A])  # SQNs 0, 1, 4
    with pytest.raises(ValueError, match="ordered"):
        encode_log_section(LOG_A, [cs[0], cs[2], cs[1]], 6)
    with pytest.raises(ValueError, match="ordered"):
        encode_log_section(LOG_A, [cs[0], cs[0]], 6)


# ------------------------------------------------------------------ corruption


def _reference() -> BuiltObject:
    return build(LOG_A, LOG_B, LOG_C)


def _regions(built: BuiltObject) -> dict[str, tuple[int, int]]:
    """Named byte ranges [start, end) of the reference object."""
    data = built.data
    a_off, a_len = built.placements[0]
    hdr = parse_log_header(data[a_off : a_off + a_len], a_len)
    koff, klen = hdr.key_groups[7]
    (flen,) = struct.unpack_from("<I", data, len(data) - 8)
    return {
        "object header": (0, OBJECT_HEADER_SIZE),
        "log header": (a_off, a_off + hdr.header_length),
        "kg block": (a_off + koff, a_off + koff + klen),
        "footer": (len(data) - 8 - flen, len(data) - 8),
        "trailer": (len(data) - 8, len(data)),
    }


@pytest.mark.parametrize("region", ["object header", "log header", "kg block", "footer", "trailer"])
@pytest.mark.parametrize("flip", [0x01, 0x80, 0xFF])
def test_any_flipped_byte_is_detected(region: str, flip: int) -> None:
    built = _reference()
    start, end = _regions(built)[region]
    for pos in range(start, end):
        damaged = bytearray(built.data)
        damaged[pos] ^= flip
        with pytest.raises(CorruptObject):
            verify_object(bytes(damaged))


def test_every_byte_of_the_object_is_covered() -> None:
    """No byte anywhere can change without verify_object noticing."""
    data = _reference().data
    for pos in range(len(data)):
        damaged = bytearray(data)
        damaged[pos] ^= 0x5A
        with pytest.raises(CorruptObject):
            verify_object(bytes(damaged))


def test_every_truncation_is_detected() -> None:
    data = _reference().data
    for n in range(len(data)):
        with pytest.raises(CorruptObject):
            verify_object(data[:n])


def test_truncated_section_is_detected() -> None:
    built = _reference()
    off, length = built.placements[0]
    sec = built.data[off : off + length]
    for n in range(length):
        with pytest.raises(CorruptObject):
            decode_section(sec[:n])


def test_flipped_kg_block_byte_fails_only_that_block() -> None:
    built = _reference()
    off, length = built.placements[0]
    damaged = bytearray(built.data[off : off + length])
    hdr = parse_log_header(bytes(damaged), length)
    koff, klen = hdr.key_groups[7]
    damaged[koff + klen // 2] ^= 0x10
    sec = bytes(damaged)
    parse_log_header(sec, length)  # the header is intact
    with pytest.raises(CorruptObject, match="key group 7"):
        list(parse_kg_block(7, sec[koff : koff + klen]))
    # other key groups of the same section still verify (per-block checksums)
    koff0, klen0 = hdr.key_groups[0]
    assert [v.sqn for v in parse_kg_block(0, sec[koff0 : koff0 + klen0])] == [0, 4]


def _with_header(data: bytes, magic: bytes, version: int) -> bytes:
    head = struct.pack("<4sHHI", magic, version, 0, 0)
    return head + struct.pack("<I", crc32c(head)) + data[OBJECT_HEADER_SIZE:]


def test_wrong_magic() -> None:
    data = _reference().data
    with pytest.raises(CorruptObject, match="not a dstl object"):
        parse_object(_with_header(data, b"XSTL", FORMAT_VERSION))
    with pytest.raises(CorruptObject, match="not a dstl object"):
        parse_object(b"PK\x03\x04" + bytes(100))


def test_wrong_version() -> None:
    data = _with_header(_reference().data, b"DSTL", FORMAT_VERSION + 1)
    with pytest.raises(CorruptObject, match="version"):
        verify_object(data)


def test_wrong_log_magic() -> None:
    built = _reference()
    off, length = built.placements[1]
    sec = b"LOG9" + built.data[off + 4 : off + length]
    with pytest.raises(CorruptObject, match="magic"):
        parse_log_header(sec, length)


def test_section_length_must_match_index() -> None:
    built = _reference()
    off, length = built.placements[1]
    sec = built.data[off : off + length]
    with pytest.raises(CorruptObject, match="index covers"):
        parse_log_header(sec, length + 1)
    with pytest.raises(CorruptObject, match="index covers"):
        parse_log_header(sec + b"\x00", length + 1)


@pytest.mark.parametrize("flen", [0, 1, 2, 3, 4, 7])
def test_tiny_footer_length_is_corrupt(flen: int) -> None:
    """A trailer claiming a footer too short to hold its own checksum."""
    data = bytearray(_reference().data)
    struct.pack_into("<I", data, len(data) - 8, flen)
    with pytest.raises(CorruptObject):
        parse_object(bytes(data))


def test_footer_pointing_past_sections() -> None:
    built = build(LOG_B)
    data = bytearray(built.data)
    (flen,) = struct.unpack_from("<I", data, len(data) - 8)
    fstart = len(data) - 8 - flen
    # rewrite the single entry's length and fix up the footer checksum
    log_id, off, length = struct.unpack_from("<16sQQ", data, fstart + 4)
    struct.pack_into("<16sQQ", data, fstart + 4, log_id, off, length + 1000)
    struct.pack_into("<I", data, len(data) - 12, crc32c(bytes(data[fstart : len(data) - 12])))
    with pytest.raises(CorruptObject, match="past the sections"):
        parse_object(bytes(data))


def test_garbage_is_corrupt() -> None:
    for blob in (b"", b"DSTL", bytes(64), b"\xff" * 200):
        with pytest.raises(CorruptObject):
            verify_object(blob)
    with pytest.raises(CorruptObject):
        parse_log_header(b"LOG1")
    with pytest.raises(CorruptObject):
        list(parse_kg_block(0, b"\x00\x00"))
    # a block with a valid checksum but an inconsistent changeset inside
    body = struct.pack("<QIQ", 1, 2, 5) + struct.pack("<2I", 1, 1) + b"abcde"
    with pytest.raises(CorruptObject, match="sizes do not match"):
        list(parse_kg_block(0, body + struct.pack("<I", crc32c(body))))
    body = struct.pack("<QIQ", 1, 1, 50) + struct.pack("<I", 50) + b"short"
    with pytest.raises(CorruptObject, match="inconsistent"):
        list(parse_kg_block(0, body + struct.pack("<I", crc32c(body))))
    one = struct.pack("<QIQ", 5, 1, 1) + struct.pack("<I", 1) + b"x"
    with pytest.raises(CorruptObject, match="inconsistent"):  # SQNs must increase
        list(parse_kg_block(0, one + one + struct.pack("<I", crc32c(one + one))))


# ------------------------------------------------------------------ forwarding merge


def test_section_moved_into_another_object_still_parses() -> None:
    """A forwarding parent concatenates children's sections without re-encoding."""
    child = build(LOG_C)
    c_off, c_len = child.placements[0]
    raw = child.data[c_off : c_off + c_len]
    forwarded = EncodedSection(LOG_C, 10, 12, [raw], c_len)
    merged = build_object([section(LOG_A), section(LOG_B), forwarded])
    m_off, m_len = merged.placements[2]
    assert m_off != c_off and m_len == c_len
    assert merged.data[m_off : m_off + m_len] == raw
    decoded = decode_object(merged.data)
    assert decoded[LOG_C] == expected(SPECS[LOG_C])
    assert decoded[LOG_A] == expected(SPECS[LOG_A])


# ------------------------------------------------------------------ packed changes


def test_check_packed_accepts_well_formed() -> None:
    check_packed(pack_changes([b"a", b"bb", b""]), max_change_bytes=2)
    check_packed(pack_changes([]), max_change_bytes=1)
    check_packed(pack_changes([b"x" * 10]), max_change_bytes=10)


@pytest.mark.parametrize(
    ("packed", "reason"),
    [
        (PackedChanges(2, struct.pack("<I", 1), b"a"), "sizes holds 4 bytes for 2 changes"),
        (PackedChanges(1, struct.pack("<2I", 1, 1), b"ab"), "sizes holds 8 bytes for 1"),
        (PackedChanges(1, b"\x01\x00\x00", b"a"), "sizes holds 3 bytes"),
        (PackedChanges(2, struct.pack("<2I", 1, 2), b"ab"), "add up to 3 bytes, payload has 2"),
        (PackedChanges(1, struct.pack("<I", 0), b"extra"), "add up to 0"),
        (PackedChanges(0, b"", b"orphan"), "payload without changes"),
        (pack_changes([b"ok", b"x" * 11]), "11 bytes exceeds the limit of 10"),
    ],
)
def test_check_packed_rejects(packed: PackedChanges, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_packed(packed, max_change_bytes=10)


def test_packed_nbytes() -> None:
    assert pack_changes([b"abc", b"de"]).nbytes == 8 + 5


@settings(max_examples=100, deadline=None, database=None)
@given(st.lists(st.binary(max_size=64), max_size=30))
def test_split_changes_inverts_pack_changes(changes: list[bytes]) -> None:
    packed = pack_changes(changes)
    assert packed.count == len(changes)
    check_packed(packed, max_change_bytes=64)
    assert split_changes(packed.count, packed.sizes, packed.payload) == changes
    assert split_changes(packed.count, memoryview(packed.sizes), memoryview(packed.payload)) == (
        changes
    )


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.binary(max_size=40), max_size=30), st.integers(min_value=1, max_value=120))
def test_a_split_changeset_keeps_its_changes_in_order_within_the_limit(
    changes: list[bytes], max_bytes: int
) -> None:
    packed = pack_changes(changes)
    view = ChangesetView(3, 7, packed.count, packed.sizes, packed.payload)
    pieces = list(view.split(max_bytes))
    assert [c for p in pieces for c in p.changes()] == changes
    assert all((p.key_group, p.sqn) == (3, 7) for p in pieces)
    for piece in pieces:
        # over the limit only where one change alone is larger than it
        assert piece.nbytes <= max_bytes or piece.count == 1
        assert piece.count >= 1 or len(pieces) == 1
    if view.nbytes <= max_bytes:
        assert pieces == [view]


def test_block_crc_chained_over_large_pieces_equals_the_crc_of_the_joined_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block of large pieces (a materialization's parts) has its CRC chained over them,
    a block of small ones over a joined copy: the same bytes either way, and valid."""
    large = [os.urandom(70_000), os.urandom(5_000)]
    cs = [
        Changeset(4, {3: [pack_changes(large), pack_changes([os.urandom(9_000)])]}),
        Changeset(5, {3: [pack_changes([b"s"])], 7: [pack_changes([b"x", b"yz"])]}),
    ]
    chained = build_object([encode_log_section(LOG_A, cs, 6)]).data
    monkeypatch.setattr(format_module, "CHAIN_CRC_PIECE_BYTES", 1 << 40)  # join every block
    joined = build_object([encode_log_section(LOG_A, cs, 6)]).data
    assert chained == joined
    verify_object(chained)
    assert decode_object(chained)[LOG_A] == {
        (3, 4): [*large, cs[0].groups[3][1].payload],
        (3, 5): [b"s"],
        (7, 5): [b"x", b"yz"],
    }


_CHANGE = st.binary(max_size=300)
_PART = st.lists(_CHANGE, max_size=4).map(pack_changes)
_GROUPS = st.dictionaries(st.integers(0, 40), st.lists(_PART, min_size=1, max_size=3), max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(_GROUPS, min_size=1, max_size=3), st.data())
def test_one_buffer_encoding_equals_the_chunked_one(
    groups: list[Mapping[int, Sequence[PackedChanges]]], data: st.DataObject
) -> None:
    """Sections of small parts are written into one buffer, of large ones kept as chunks of
    the parts' own bytes: byte for byte the same section, for any changesets."""
    if data.draw(st.booleans()):  # now and then a large part, as a materialization's
        groups[0] = {**groups[0], 41: [pack_changes([os.urandom(20_000)])]}
    sqns = sorted(
        data.draw(st.sets(st.integers(0, 50), min_size=len(groups), max_size=len(groups)))
    )
    cs = [Changeset(sqn, g) for sqn, g in zip(sqns, groups, strict=True)]
    end = sqns[-1] + 1
    joined = format_module._encode_joined(LOG_A, cs, end)
    chunked = format_module._encode_pieces(LOG_A, cs, end)
    assert joined.length == chunked.length
    data_joined = build_object([joined]).data
    assert data_joined == build_object([chunked]).data
    assert build_object([encode_log_section(LOG_A, cs, end)]).data == data_joined
    verify_object(data_joined)
    expected = {
        (kg, c.sqn): [x for p in parts for x in split_changes(p.count, p.sizes, p.payload)]
        for c in cs
        for kg, parts in c.groups.items()
    }
    assert decode_object(data_joined).get(LOG_A, {}) == expected
