"""ChangeBuffer: client-side packing of appends, the same bytes as format.pack_changes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client._buffer import ChangeBuffer
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import ChangeTooLarge, InvalidArgument, KeyGroupOutOfRange
from dstl_client.core.format import PackedChanges, check_packed, pack_changes, split_changes


def test_drain_matches_pack_changes() -> None:
    buf = ChangeBuffer((10, 20), max_change_bytes=100)
    appended = [(12, b"a"), (10, b"bb"), (12, b""), (20, b"x" * 100), (12, b"ccc")]
    for kg, data in appended:
        buf.check(kg, len(data))
        buf.add(kg, data)
    assert buf.count == 5
    assert buf.nbytes == sum(len(d) + 4 for _, d in appended)
    msgs = buf.drain()
    assert [m.key_group for m in msgs] == [10, 12, 20]  # key-group order
    for msg in msgs:
        changes = [d for kg, d in appended if kg == msg.key_group]
        expected = pack_changes(changes)
        assert (msg.count, msg.sizes, msg.payload) == (
            expected.count,
            expected.sizes,
            expected.payload,
        )
        check_packed(PackedChanges(msg.count, msg.sizes, msg.payload), 100)


def test_drain_empties_the_buffer() -> None:
    buf = ChangeBuffer((0, 3), max_change_bytes=10)
    buf.add(1, b"one")
    assert len(buf.drain()) == 1
    assert (buf.count, buf.nbytes) == (0, 0)
    assert buf.drain() == []
    buf.add(2, b"two")
    msgs = buf.drain()
    assert [(m.key_group, m.payload) for m in msgs] == [(2, b"two")]


@settings(max_examples=60, deadline=None, database=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.binary(max_size=30)), max_size=40))
def test_packing_property(appended: list[tuple[int, bytes]]) -> None:
    buf = ChangeBuffer((0, 7), max_change_bytes=30)
    for kg, data in appended:
        buf.check(kg, len(data))
        buf.add(kg, data)
    got = {m.key_group: split_changes(m.count, m.sizes, m.payload) for m in buf.drain()}
    want: dict[int, list[bytes]] = {}
    for kg, data in appended:
        want.setdefault(kg, []).append(data)
    assert got == want


def test_key_group_range_is_inclusive() -> None:
    buf = ChangeBuffer((10, 20), max_change_bytes=100)
    buf.check(10, 1)
    buf.check(20, 1)
    for kg in (9, 21, -1, 1 << 30):
        with pytest.raises(KeyGroupOutOfRange, match=r"outside the writer's range \[10, 20\]"):
            buf.check(kg, 1)


def test_change_size_limit() -> None:
    buf = ChangeBuffer((0, 0), max_change_bytes=100)
    buf.check(0, 0)
    buf.check(0, 100)
    with pytest.raises(ChangeTooLarge, match="101 bytes exceeds the limit of 100") as info:
        buf.check(0, 101)
    assert isinstance(info.value, InvalidArgument)


def test_checks_do_not_change_the_buffer() -> None:
    buf = ChangeBuffer((0, 0), max_change_bytes=1)
    with pytest.raises(ChangeTooLarge):
        buf.check(0, 2)
    with pytest.raises(KeyGroupOutOfRange):
        buf.check(1, 1)
    assert (buf.count, buf.nbytes, buf.drain()) == (0, 0, [])


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.integers(0, 9), st.binary(max_size=20)),
        min_size=1,
        max_size=40,
    )
)
def test_drain_packed_holds_the_same_parts_as_drain(appended: list[tuple[int, bytes]]) -> None:
    """The packed form (four byte strings) is the repeated form's parts, in order."""
    one, two = (ChangeBuffer((0, 9), max_change_bytes=100) for _ in range(2))
    for buf in (one, two):
        for kg, data in appended:
            buf.add(kg, data)
    parts = one.drain()
    req = pb.AppendRequest()
    two.drain_to(req)
    assert not req.changes and req.HasField("packed")
    p = req.packed
    n = len(parts)
    assert struct.unpack(f"<{n}I", p.key_groups) == tuple(m.key_group for m in parts)
    assert struct.unpack(f"<{n}I", p.counts) == tuple(m.count for m in parts)
    assert p.sizes == b"".join(m.sizes for m in parts)
    assert p.payload == b"".join(m.payload for m in parts)
    assert (two.count, two.nbytes) == (0, 0)


def test_drain_to_fills_the_form_the_sidecar_accepts_and_nothing_when_empty() -> None:
    old = ChangeBuffer((0, 9), max_change_bytes=100, packed=False)
    old.add(3, b"x")
    req = pb.PersistRequest()
    old.drain_to(req)
    assert len(req.changes) == 1 and not req.HasField("packed")
    empty = pb.PersistRequest()
    ChangeBuffer((0, 9), max_change_bytes=100).drain_to(empty)
    assert not empty.changes and not empty.HasField("packed")
