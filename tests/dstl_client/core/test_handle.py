"""Changelog handles: serialization, invariants, combining."""

from __future__ import annotations

import dataclasses
import random
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import InvalidArgument, InvalidHandle
from dstl_client.core.handle import (
    HANDLE_VERSION,
    MAX_ENTRIES,
    MAX_KEY_GROUP,
    MAX_OBJECT_KEY_CHARS,
    MAX_OBJECT_OFFSET,
    MAX_SECTION_BYTES,
    MAX_SQN,
    ChangelogHandle,
    HandleEntry,
)

LOG = "0123456789abcdef0123456789abcdef"
E1 = HandleEntry("job/aa/" + "a" * 32 + ".dstl", 16, 100, 0, 1)
E2 = HandleEntry("job/bb/" + "b" * 32 + ".dstl", 116, 250, 1, 3)
E3 = HandleEntry("job/cc/" + "c" * 32 + ".dstl", 16, 42, 3, 4)


def handle(
    from_sqn: int = 0, to_sqn: int = 4, entries: tuple[HandleEntry, ...] = (E1, E2, E3)
) -> ChangelogHandle:
    return ChangelogHandle("job", LOG, (0, 127), from_sqn, to_sqn, entries)


def test_roundtrip_bytes() -> None:
    h = handle()
    blob = h.to_bytes()
    assert isinstance(blob, bytes)
    assert ChangelogHandle.from_bytes(blob) == h
    assert ChangelogHandle.from_bytes(blob).to_bytes() == blob
    # deterministic: equal handles give equal bytes
    assert handle().to_bytes() == blob


def test_roundtrip_empty_handle() -> None:
    h = handle(3, 3, ())
    assert h.is_empty()
    assert ChangelogHandle.from_bytes(h.to_bytes()) == h


@settings(max_examples=60, deadline=None, database=None)
@given(
    st.integers(0, 2**24 - 1),
    st.integers(0, 1000),
    st.lists(
        st.tuples(st.integers(0, 2**40), st.integers(1, 2**31), st.integers(1, 5)), max_size=8
    ),
    st.text(min_size=1, max_size=20),
)
def test_roundtrip_property(
    first_kg: int, width: int, raw: list[tuple[int, int, int]], job: str
) -> None:
    entries = []
    sqn = 7
    for i, (off, length, span) in enumerate(raw):
        entries.append(HandleEntry(f"{job}/{i:02x}/k", off, length, sqn, sqn + span))
        sqn += span
    last_kg = min(first_kg + width, MAX_KEY_GROUP)
    h = ChangelogHandle(job, LOG, (first_kg, last_kg), 7, sqn, tuple(entries))
    assert ChangelogHandle.from_bytes(h.to_bytes()) == h


def test_properties() -> None:
    h = handle(entries=(E1, E2, dataclasses.replace(E3, object_key=E1.object_key)))
    assert h.object_keys == (E1.object_key, E2.object_key)
    assert h.stored_bytes == 100 + 250 + 42
    assert not h.is_empty()


@pytest.mark.parametrize(
    "blob",
    [b"\xff\xff\xff", b"\x0a\x05abc", b"\x42" * 10, bytes(range(256))],
)
def test_malformed_bytes(blob: bytes) -> None:
    with pytest.raises(InvalidHandle) as info:
        ChangelogHandle.from_bytes(blob)
    # InvalidHandle is an InvalidArgument, so generic bad-input handlers catch it
    assert isinstance(info.value, InvalidArgument)


def test_empty_bytes_have_no_version() -> None:
    with pytest.raises(InvalidHandle, match="version 0"):
        ChangelogHandle.from_bytes(b"")


def test_unknown_version() -> None:
    msg = handle().to_proto()
    msg.format_version = HANDLE_VERSION + 1
    with pytest.raises(InvalidHandle, match="version"):
        ChangelogHandle.from_bytes(msg.SerializeToString())


def test_truncated_bytes() -> None:
    blob = handle().to_bytes()
    failures = 0
    for n in range(1, len(blob)):
        try:
            ChangelogHandle.from_bytes(blob[:n])
        except InvalidHandle:
            failures += 1
    # a protobuf prefix may still decode (fields are optional), but most cut points
    # fall inside a field; none may raise anything but InvalidHandle
    assert failures > len(blob) // 2


def _decoded_with(**fields: object) -> bytes:
    msg = handle().to_proto()
    for name, value in fields.items():
        setattr(msg, name, value)
    return bytes(msg.SerializeToString())


@pytest.mark.parametrize(
    "fields",
    [
        {"log_id": "not hex at all, but 32 chars...."},
        {"log_id": "abc"},
        {"log_id": ""},
        {"first_key_group": 10, "last_key_group": 5},
        {"from_sqn": 5, "to_sqn": 4},
    ],
)
def test_inconsistent_decoded_handle(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidHandle):
        ChangelogHandle.from_bytes(_decoded_with(**fields))


def test_bad_entry_in_bytes() -> None:
    msg = handle().to_proto()
    msg.entries.append(pb.HandleEntry(object_key="k", offset=0, length=0, first_sqn=4, end_sqn=5))
    with pytest.raises(InvalidHandle, match="bad handle entry"):
        ChangelogHandle.from_bytes(msg.SerializeToString())


@pytest.mark.parametrize(
    "entries",
    [
        (E2, E1),  # out of SQN order
        (E1, dataclasses.replace(E2, first_sqn=0)),  # overlapping SQN ranges
        (E1, E1),  # the same section twice
        (dataclasses.replace(E1, object_key=""),),
        (dataclasses.replace(E1, length=0),),
        (dataclasses.replace(E1, end_sqn=0),),  # empty SQN range
        (dataclasses.replace(E1, first_sqn=2, end_sqn=1),),  # inverted
    ],
)
def test_invariants_of_entries(entries: tuple[HandleEntry, ...]) -> None:
    with pytest.raises(InvalidHandle):
        handle(entries=entries)


@pytest.mark.parametrize(
    ("kg_range", "log_id", "sqns"),
    [
        ((5, 4), LOG, (0, 1)),
        ((-1, 4), LOG, (0, 1)),
        ((0, 4), LOG, (2, 1)),
        ((0, 4), LOG[:-1], (0, 1)),
        ((0, 4), LOG + "0", (0, 1)),
        ((0, 4), "g" * 32, (0, 1)),
    ],
)
def test_invariants_of_handle(
    kg_range: tuple[int, int], log_id: str, sqns: tuple[int, int]
) -> None:
    with pytest.raises(InvalidHandle):
        ChangelogHandle("job", log_id, kg_range, sqns[0], sqns[1], ())


def test_entries_may_start_before_the_handle_range() -> None:
    """A reused section holds older changesets; the handle's from_sqn filters them."""
    h = handle(from_sqn=2, to_sqn=4, entries=(E2, E3))
    assert h.entries[0].first_sqn < h.from_sqn


# ------------------------------------------------------------------ combine


def test_combine_consecutive() -> None:
    a = handle(0, 1, (E1,))
    b = handle(1, 3, (E2,))
    c = handle(3, 4, (E3,))
    combined = ChangelogHandle.combine([a, b, c])
    assert combined == handle(0, 4, (E1, E2, E3))


def test_combine_shares_reused_entries_once() -> None:
    a = handle(0, 2, (E1, E2))  # E2 covers [1, 3): reused by the next handle
    b = handle(2, 4, (E2, E3))
    combined = ChangelogHandle.combine([a, b])
    assert combined.entries == (E1, E2, E3)
    assert (combined.from_sqn, combined.to_sqn) == (0, 4)


def test_combine_single_and_empty_handles() -> None:
    a = handle(0, 1, (E1,))
    assert ChangelogHandle.combine([a]) == a
    assert ChangelogHandle.combine([a, handle(1, 1, ())]) == a


def test_combine_rejects() -> None:
    a = handle(0, 1, (E1,))
    with pytest.raises(InvalidHandle, match="nothing"):
        ChangelogHandle.combine([])
    with pytest.raises(InvalidHandle, match="consecutive"):
        ChangelogHandle.combine([a, handle(3, 4, (E3,))])  # gap
    with pytest.raises(InvalidHandle, match="consecutive"):
        ChangelogHandle.combine([handle(1, 3, (E2,)), a])  # wrong order
    other = ChangelogHandle("job", "f" * 32, (0, 127), 1, 3, (E2,))
    with pytest.raises(InvalidHandle, match="consecutive"):
        ChangelogHandle.combine([a, other])  # another writer


# ------------------------------------------------------------------ bounds

Mutation = Callable[[pb.Handle], None]


def _set(path: str, value: int) -> Mutation:
    """Set ``field`` of the handle or ``entries.N.field`` of one of its entries."""

    def mutate(msg: pb.Handle) -> None:
        *where, name = path.split(".")
        target: object = msg.entries[int(where[1])] if where else msg
        setattr(target, name, value)

    return mutate


def _all(*mutations: Mutation) -> Mutation:
    def mutate(msg: pb.Handle) -> None:
        for m in mutations:
            m(msg)

    return mutate


# Each breaks exactly one bound and keeps every other invariant of handle().
OUT_OF_BOUNDS: dict[str, Mutation] = {
    "length 2**64-1": _set("entries.0.length", 2**64 - 1),
    "length 2**40": _set("entries.0.length", 2**40),
    "length just over": _set("entries.0.length", MAX_SECTION_BYTES + 1),
    "offset 2**63": _set("entries.0.offset", 2**63),
    "offset just over": _set("entries.0.offset", MAX_OBJECT_OFFSET + 1),
    "end sqn 2**64-1": _all(_set("entries.2.end_sqn", 2**64 - 1), _set("to_sqn", 2**64 - 1)),
    "entry end sqn 2**64-1": _set("entries.2.end_sqn", 2**64 - 1),
    "entry sqns 2**63": _all(
        _set("entries.2.first_sqn", 2**63), _set("entries.2.end_sqn", 2**63 + 1)
    ),
    "to sqn 2**64-1": _set("to_sqn", 2**64 - 1),
    "sqns 2**63": _all(_set("entries.2.end_sqn", 2**63), _set("to_sqn", 2**63)),
    "key group 2**32-1": _set("last_key_group", 2**32 - 1),
    "both key groups 2**32-1": _all(
        _set("first_key_group", 2**32 - 1), _set("last_key_group", 2**32 - 1)
    ),
    "key group just over": _set("last_key_group", MAX_KEY_GROUP + 1),
}


@pytest.mark.parametrize("mutate", OUT_OF_BOUNDS.values(), ids=OUT_OF_BOUNDS.keys())
def test_numbers_out_of_bounds_are_invalid(mutate: Mutation) -> None:
    msg = handle().to_proto()
    mutate(msg)
    with pytest.raises(InvalidHandle) as info:
        ChangelogHandle.from_proto(msg)
    assert isinstance(info.value, InvalidArgument)
    assert len(info.value.message) < 300
    with pytest.raises(InvalidHandle):
        ChangelogHandle.from_bytes(msg.SerializeToString())


def test_numbers_at_the_bounds_are_valid() -> None:
    msg = handle().to_proto()
    _all(
        _set("entries.0.length", MAX_SECTION_BYTES),
        _set("entries.0.offset", MAX_OBJECT_OFFSET),
        _set("entries.2.end_sqn", MAX_SQN),
        _set("to_sqn", MAX_SQN),
        _set("last_key_group", MAX_KEY_GROUP),
    )(msg)
    h = ChangelogHandle.from_bytes(msg.SerializeToString())
    assert h.key_group_range == (0, MAX_KEY_GROUP) and h.to_sqn == MAX_SQN
    assert ChangelogHandle.from_bytes(h.to_bytes()) == h


def test_too_many_entries() -> None:
    def entries(n: int) -> tuple[HandleEntry, ...]:
        return tuple(HandleEntry("job/aa/k", i, 1, i, i + 1) for i in range(n))

    assert len(handle(0, MAX_ENTRIES, entries(MAX_ENTRIES)).entries) == MAX_ENTRIES
    with pytest.raises(InvalidHandle, match="entries"):
        handle(0, MAX_ENTRIES + 1, entries(MAX_ENTRIES + 1))


def test_object_key_length() -> None:
    at_limit = "job/aa/" + "k" * (MAX_OBJECT_KEY_CHARS - len("job/aa/"))
    handle(entries=(dataclasses.replace(E1, object_key=at_limit), E2, E3))
    too_long = "job/aa/" + "k" * 100_000
    with pytest.raises(InvalidHandle) as info:
        handle(entries=(dataclasses.replace(E1, object_key=too_long), E2, E3))
    assert len(info.value.message) < 300  # the key is cut short in the message


def test_long_log_id_is_cut_short_in_the_message() -> None:
    with pytest.raises(InvalidHandle) as info:
        ChangelogHandle("job", "a" * 100_000, (0, 1), 0, 0, ())
    assert len(info.value.message) < 300


@pytest.mark.parametrize("seed", range(20))
def test_garbage_bytes_are_an_invalid_handle(seed: int) -> None:
    rng = random.Random(seed)
    blob = rng.randbytes(rng.randint(1, 4096))
    with pytest.raises(InvalidHandle):
        ChangelogHandle.from_bytes(blob)


def test_entries_are_counted_before_any_is_built() -> None:
    """A message of many (empty) entries is refused without building them: the probe's
    padded handle built every entry first, hundreds of MiB."""
    msg = pb.Handle.FromString(b"\x08\x01" + b"\x42\x00" * (MAX_ENTRIES + 1))
    tracemalloc.start()
    try:
        with pytest.raises(InvalidHandle, match=f"{MAX_ENTRIES + 1} entries"):
            ChangelogHandle.from_proto(msg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10, f"{peak} bytes allocated to refuse the handle"
