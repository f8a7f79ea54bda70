"""The section encoder against a plain reading of the format grammar.

:func:`reference_section` writes a log section the obvious way, straight from
the grammar in :mod:`dstl_client.core.format`'s docstring (one ``struct`` call
per field group, no fast paths); the encoder's bytes must equal it for any
changesets, on both of its paths (one buffer for small parts, chunks for large
ones), and the module's readers must read every change back.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client.core import format as format_module
from dstl_client.core.format import (
    Changeset,
    PackedChanges,
    build_object,
    encode_log_section,
    pack_changes,
    parse_kg_block,
    parse_log_header,
    split_changes,
    verify_log_section,
    verify_object,
)

LOG_ID = bytes(range(100, 116))


def _crc(data: bytes) -> bytes:
    return struct.pack("<I", crc32c.crc32c(data))


def reference_section(log_id: bytes, changesets: Sequence[Changeset], end_sqn: int) -> bytes:
    """``log_section`` of the grammar, field by field::

    log_section := log_header  kg_block*
    log_header  := "LOG1" 16s log_id u32 n_kg u64 first_sqn u64 end_sqn
                   (u32 key_group u64 offset u64 length)*n_kg   u32 crc32c
    kg_block    := changeset*  u32 crc32c(changesets)
    changeset   := u64 sqn u32 count u64 payload_length  (u32 size)*count  payload

    Key groups ascending, a key group's changesets in SQN order, a changeset's
    parts of one key group merged; offsets from the section's first byte.
    """
    kgs = sorted({kg for cs in changesets for kg in cs.groups})
    blocks: list[bytes] = []
    for kg in kgs:
        body = b""
        for cs in changesets:
            if kg not in cs.groups:
                continue
            parts = cs.groups[kg]
            count = sum(p.count for p in parts)
            sizes = b"".join(p.sizes for p in parts)
            payload = b"".join(p.payload for p in parts)
            body += struct.pack("<QIQ", cs.sqn, count, len(payload)) + sizes + payload
        blocks.append(body + _crc(body))
    header = b"LOG1" + log_id + struct.pack("<IQQ", len(kgs), changesets[0].sqn, end_sqn)
    offset = len(header) + 20 * len(kgs) + 4
    for kg, block in zip(kgs, blocks, strict=True):
        header += struct.pack("<IQQ", kg, offset, len(block))
        offset += len(block)
    return header + _crc(header) + b"".join(blocks)


def _changes_of(changesets: Sequence[Changeset]) -> dict[tuple[int, int], list[bytes]]:
    """(key group, SQN) -> the changes, in append order, as written."""
    return {
        (kg, cs.sqn): [c for p in parts for c in split_changes(p.count, p.sizes, p.payload)]
        for cs in changesets
        for kg, parts in cs.groups.items()
    }


def _read_back(section: bytes) -> dict[tuple[int, int], list[bytes]]:
    """Every change of ``section``, through the module's readers (all checksums verified)."""
    index = verify_log_section(section)
    assert index == parse_log_header(section, len(section))
    out: dict[tuple[int, int], list[bytes]] = {}
    for kg, (off, length) in index.key_groups.items():
        for view in parse_kg_block(kg, section[off : off + length]):
            out[(kg, view.sqn)] = view.changes()
    return out


def _check(changesets: Sequence[Changeset], end_sqn: int) -> bytes:
    """Encode, compare with the reference, read back; the section's bytes."""
    expected = reference_section(LOG_ID, changesets, end_sqn)
    encoded = encode_log_section(LOG_ID, changesets, end_sqn)
    section = b"".join(encoded.chunks)
    assert section == expected
    assert encoded.length == len(expected)
    assert (encoded.log_id, encoded.first_sqn, encoded.end_sqn) == (
        LOG_ID,
        changesets[0].sqn,
        end_sqn,
    )
    # both encodings, whichever encode_log_section chose
    for encode in (format_module._encode_joined, format_module._encode_pieces):
        assert b"".join(encode(LOG_ID, changesets, end_sqn).chunks) == expected
    assert _read_back(section) == _changes_of(changesets)
    data = build_object([encoded]).data
    assert verify_object(data).sections == {
        LOG_ID: (format_module.OBJECT_HEADER_SIZE, len(section))
    }
    return section


# parts as the sidecar holds them: at least one change each (it refuses empty parts),
# changes of any size including 0 bytes
_CHANGE = st.binary(max_size=200)
_PART = st.lists(_CHANGE, min_size=1, max_size=4).map(pack_changes)
_LARGE_PART = st.integers(4_096, 20_000).map(lambda n: pack_changes([os.urandom(n)]))
_PARTS = st.lists(_PART, min_size=1, max_size=4)
_KEY_GROUP = st.integers(0, (1 << 32) - 1)


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(st.dictionaries(_KEY_GROUP, _PARTS, max_size=8), min_size=1, max_size=4),
    st.integers(0, 1 << 62),
    st.lists(st.integers(1, 1 << 20), min_size=4, max_size=4),
    st.booleans(),
)
def test_sections_equal_the_reference_encoding_and_read_back(
    groups: list[dict[int, list[PackedChanges]]], first: int, gaps: list[int], large: bool
) -> None:
    """Several changesets, several parts per key group, key groups shared or not."""
    if large:  # a materialization's part now and then: the chunked encoding
        groups[0] = {**groups[0], 7: [pack_changes([os.urandom(30_000)])]}
    sqns = [first + sum(gaps[: i + 1]) for i in range(len(groups))]
    changesets = [Changeset(sqn, g) for sqn, g in zip(sqns, groups, strict=True)]
    _check(changesets, sqns[-1] + gaps[-1])


@settings(max_examples=100, deadline=None, database=None)
@given(
    st.dictionaries(st.integers(0, 1023), _PART, min_size=1, max_size=300),
    st.integers(0, 1 << 40),
)
def test_a_checkpoint_section_equals_the_reference_encoding(
    parts: dict[int, PackedChanges], sqn: int
) -> None:
    """The usual section: one changeset, one part per key group (the encoder's fast path)."""
    _check([Changeset(sqn, {kg: [p] for kg, p in parts.items()})], sqn + 1)


@settings(max_examples=50, deadline=None, database=None)
@given(st.lists(st.one_of(_PART, _LARGE_PART), min_size=2, max_size=60), st.booleans())
def test_one_key_group_of_many_parts_equals_the_reference_encoding(
    parts: list[PackedChanges], more_key_groups: bool
) -> None:
    groups: dict[int, list[PackedChanges]] = {9: parts}
    if more_key_groups:
        groups |= {kg: [pack_changes([b"k" * kg])] for kg in (1, 20, 300)}
    _check([Changeset(4, groups)], 5)


@pytest.mark.parametrize(
    "groups",
    [
        {},  # a changeset of no key group: a section of only its header
        {3: [pack_changes([])]},  # a part of no change (count 0)
        {3: []},  # a key group of no part: an empty changeset in its block
        {3: [pack_changes([b"a"])], 4: [], 5: [pack_changes([]), pack_changes([b"bc"])]},
        # one-part key groups first, the key group of several parts last (the fast
        # comprehension gets far before it gives way)
        {**{kg: [pack_changes([bytes([kg])])] for kg in range(50)}, 99: [pack_changes([b"p"])] * 2},
    ],
)
def test_edge_shapes_equal_the_reference_encoding(
    groups: Mapping[int, Sequence[PackedChanges]],
) -> None:
    _check([Changeset(2, groups)], 3)
    _check([Changeset(1, {3: [pack_changes([b"x"])]}), Changeset(2, groups)], 3)
