"""HandleReader over an in-memory ranged fetch of real encoded objects."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Mapping, Sequence

import pytest

from dstl_client.core import reader as reader_mod
from dstl_client.core.errors import CorruptObject, InvalidArgument
from dstl_client.core.format import (
    LOG_FIXED_SIZE,
    ChangesetView,
    EncodedSection,
    build_object,
    encode_log_section,
    log_header_length,
    pack_changes,
)
from dstl_client.core.format import Changeset as FormatChangeset
from dstl_client.core.handle import ChangelogHandle, HandleEntry
from dstl_client.core.reader import HandleReader

LOG = bytes(range(16))
OTHER_LOG = b"\x99" * 16
KG_RANGE = (0, 15)


class MemoryObjects:
    """A ranged fetch over objects held in a dict; records every request."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, int, int]] = []
        self.short_by = 0

    async def fetch(self, key: str, offset: int, length: int) -> bytes:
        self.requests.append((key, offset, length))
        data = self.objects[key][offset : offset + length]
        return data[: len(data) - self.short_by] if self.short_by else data

    @property
    def fetched_bytes(self) -> int:
        return sum(r[2] for r in self.requests)

    def put_section(
        self,
        key: str,
        changesets: Mapping[int, Mapping[int, Sequence[bytes]]],
        end_sqn: int,
        log_id: bytes = LOG,
        neighbours: int = 1,
    ) -> HandleEntry:
        """Store an object holding this log's section between other logs' sections."""
        css = [
            FormatChangeset(sqn, {kg: [pack_changes(ch)] for kg, ch in groups.items()})
            for sqn, groups in sorted(changesets.items())
        ]
        mine = encode_log_section(log_id, css, end_sqn)
        filler = [
            encode_log_section(
                bytes([i]) * 16, [FormatChangeset(0, {1: [pack_changes([b"noise"])]})], 1
            )
            for i in range(200, 200 + neighbours)
        ]
        built = build_object([*filler, mine, *filler[:1]])
        self.objects[key] = built.data
        off, length = built.placements[neighbours]
        return HandleEntry(key, off, length, mine.first_sqn, mine.end_sqn)


def make_handle(
    entries: Iterable[HandleEntry], from_sqn: int, to_sqn: int, log_id: bytes = LOG
) -> ChangelogHandle:
    return ChangelogHandle("job", log_id.hex(), KG_RANGE, from_sqn, to_sqn, tuple(entries))


async def read_all(
    store: MemoryObjects, h: ChangelogHandle, key_groups: Iterable[int] | None = None
) -> list[tuple[int, int, list[bytes]]]:
    views: list[ChangesetView] = [v async for v in HandleReader(store.fetch).read(h, key_groups)]
    return [(v.key_group, v.sqn, v.changes()) for v in views]


@pytest.fixture
def store() -> MemoryObjects:
    return MemoryObjects()


@pytest.fixture
def two_entries(store: MemoryObjects) -> tuple[HandleEntry, HandleEntry]:
    """SQNs 0..2 in one object, 3..5 in another, key groups 1, 2 and 9."""
    e1 = store.put_section(
        "job/01/a",
        {0: {1: [b"s0-kg1"], 2: [b"s0-kg2"]}, 1: {1: [b"s1-kg1a", b"s1-kg1b"]}, 2: {9: [b"s2"]}},
        3,
    )
    e2 = store.put_section(
        "job/02/b", {3: {2: [b"s3"]}, 4: {1: [b"s4"], 9: [b"s4-9"]}, 5: {1: [b"s5"]}}, 6
    )
    return e1, e2


@pytest.mark.asyncio
async def test_reads_everything_in_entry_kg_sqn_order(
    store: MemoryObjects, two_entries: tuple[HandleEntry, HandleEntry]
) -> None:
    got = await read_all(store, make_handle(two_entries, 0, 6))
    assert got == [
        (1, 0, [b"s0-kg1"]),
        (1, 1, [b"s1-kg1a", b"s1-kg1b"]),
        (2, 0, [b"s0-kg2"]),
        (9, 2, [b"s2"]),
        (1, 4, [b"s4"]),
        (1, 5, [b"s5"]),
        (2, 3, [b"s3"]),
        (9, 4, [b"s4-9"]),
    ]


@pytest.mark.parametrize(
    ("from_sqn", "to_sqn", "sqns"),
    [
        (0, 6, [0, 1, 2, 3, 4, 5]),
        (1, 6, [1, 2, 3, 4, 5]),
        (2, 4, [2, 3]),  # lower bound inclusive, upper bound exclusive
        (3, 4, [3]),
        (2, 3, [2]),
        (0, 1, [0]),
        (5, 6, [5]),
        (4, 4, []),
    ],
)
@pytest.mark.asyncio
async def test_sqn_filtering_at_boundaries(
    store: MemoryObjects,
    two_entries: tuple[HandleEntry, HandleEntry],
    from_sqn: int,
    to_sqn: int,
    sqns: list[int],
) -> None:
    got = await read_all(store, make_handle(two_entries, from_sqn, to_sqn))
    assert sorted({sqn for _, sqn, _ in got}) == sqns


@pytest.mark.asyncio
async def test_entries_outside_the_range_are_not_fetched(
    store: MemoryObjects, two_entries: tuple[HandleEntry, HandleEntry]
) -> None:
    await read_all(store, make_handle(two_entries, 3, 6))
    assert {r[0] for r in store.requests} == {"job/02/b"}
    store.requests.clear()
    await read_all(store, make_handle(two_entries, 0, 3))
    assert {r[0] for r in store.requests} == {"job/01/a"}


@pytest.mark.asyncio
async def test_key_group_filtering(
    store: MemoryObjects, two_entries: tuple[HandleEntry, HandleEntry]
) -> None:
    h = make_handle(two_entries, 0, 6)
    assert await read_all(store, h, [9]) == [(9, 2, [b"s2"]), (9, 4, [b"s4-9"])]
    assert await read_all(store, h, [2, 9]) == [
        (2, 0, [b"s0-kg2"]),
        (9, 2, [b"s2"]),
        (2, 3, [b"s3"]),
        (9, 4, [b"s4-9"]),
    ]
    # a key group in range that holds no changes yields nothing
    assert await read_all(store, h, [15]) == []
    assert await read_all(store, h, []) == []


@pytest.mark.parametrize("kgs", [[16], [0, 100], [2**31]])
@pytest.mark.asyncio
async def test_key_group_outside_handle_range(
    store: MemoryObjects, two_entries: tuple[HandleEntry, HandleEntry], kgs: list[int]
) -> None:
    with pytest.raises(InvalidArgument, match="outside the handle's range"):
        await read_all(store, make_handle(two_entries, 0, 6), kgs)
    assert store.requests == []  # refused before any read


@pytest.mark.asyncio
async def test_section_of_another_log(
    store: MemoryObjects,
    two_entries: tuple[HandleEntry, HandleEntry],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    foreign = store.put_section("job/03/c", {0: {1: [b"theirs"]}}, 1, log_id=OTHER_LOG)
    with pytest.raises(CorruptObject, match="belongs to log"):
        await read_all(store, make_handle([foreign], 0, 1))
    # the same failure on the ranged per-key-group path
    monkeypatch.setattr(reader_mod, "WHOLE_SECTION_READ_BYTES", 0)
    with pytest.raises(CorruptObject, match="belongs to log"):
        await read_all(store, make_handle([foreign, two_entries[1]], 0, 6), [1])


@pytest.mark.asyncio
async def test_entry_pointing_at_the_wrong_offset(
    store: MemoryObjects, two_entries: tuple[HandleEntry, HandleEntry]
) -> None:
    e1 = two_entries[0]
    shifted = HandleEntry(e1.object_key, e1.offset + 1, e1.length, e1.first_sqn, e1.end_sqn)
    with pytest.raises(CorruptObject):
        await read_all(store, make_handle([shifted], 0, 3))


@pytest.mark.asyncio
async def test_entry_sqn_range_differs_from_section(
    store: MemoryObjects, two_entries: tuple[HandleEntry, HandleEntry]
) -> None:
    e1 = two_entries[0]
    lying = HandleEntry(e1.object_key, e1.offset, e1.length, e1.first_sqn, e1.end_sqn + 1)
    with pytest.raises(CorruptObject, match="SQN range"):
        await read_all(store, make_handle([lying], 0, 4))


@pytest.mark.parametrize("key_groups", [None, [1]])
@pytest.mark.asyncio
async def test_truncated_fetch(
    store: MemoryObjects,
    two_entries: tuple[HandleEntry, HandleEntry],
    key_groups: list[int] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reader_mod, "WHOLE_SECTION_READ_BYTES", 0)  # ranged path for [1]
    store.short_by = 1
    with pytest.raises(CorruptObject, match="truncated"):
        await read_all(store, make_handle(two_entries, 0, 6), key_groups)


@pytest.mark.asyncio
async def test_object_shorter_than_the_entry(
    store: MemoryObjects, two_entries: tuple[HandleEntry, HandleEntry]
) -> None:
    e2 = two_entries[1]
    store.objects[e2.object_key] = store.objects[e2.object_key][: e2.offset + e2.length - 3]
    with pytest.raises(CorruptObject):
        await read_all(store, make_handle(two_entries, 0, 6))


@pytest.mark.asyncio
async def test_corrupt_block_is_never_returned(
    store: MemoryObjects, two_entries: tuple[HandleEntry, HandleEntry]
) -> None:
    e1 = two_entries[0]
    data = bytearray(store.objects[e1.object_key])
    data[e1.offset + e1.length - 10] ^= 0x01  # inside the last key group's block
    store.objects[e1.object_key] = bytes(data)
    got: list[ChangesetView] = []
    with pytest.raises(CorruptObject):
        async for view in HandleReader(store.fetch).read(make_handle(two_entries, 0, 6), [9]):
            got.append(view)
    assert got == []


@pytest.mark.asyncio
async def test_key_group_outside_the_writers_range_in_the_section(store: MemoryObjects) -> None:
    entry = store.put_section("job/04/d", {0: {1: [b"ok"], 40: [b"bad"]}}, 1)
    with pytest.raises(CorruptObject, match="outside the writer's range"):
        await read_all(store, make_handle([entry], 0, 1))


@pytest.mark.asyncio
async def test_log_header_longer_than_the_section_is_refused(
    store: MemoryObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handle whose section is shorter than the header found there: no read sized by it."""
    monkeypatch.setattr(reader_mod, "WHOLE_SECTION_READ_BYTES", 0)  # the ranged (header) path
    entry = store.put_section("job/07/g", {0: {kg: [b"x"] for kg in range(16)}}, 1)
    start = store.objects[entry.object_key][entry.offset : entry.offset + LOG_FIXED_SIZE]
    hlen = log_header_length(start)
    assert LOG_FIXED_SIZE < hlen < entry.length
    short = dataclasses.replace(entry, length=hlen - 1)
    with pytest.raises(CorruptObject, match=f"log header of {hlen} bytes does not fit") as info:
        await read_all(store, make_handle([short], 0, 1), [1])
    assert entry.object_key in info.value.message
    # only the fixed part was read: nothing past the section the handle names
    assert store.requests == [(entry.object_key, entry.offset, LOG_FIXED_SIZE)]
    # the same section with its real length reads fine
    assert await read_all(store, make_handle([entry], 0, 1), [1]) == [(1, 0, [b"x"])]


@pytest.mark.asyncio
async def test_forged_key_group_count_is_refused_before_reading_the_header(
    store: MemoryObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_mod, "WHOLE_SECTION_READ_BYTES", 0)
    entry = store.put_section("job/08/h", {0: {1: [b"a"], 2: [b"b"]}}, 1)
    data = bytearray(store.objects[entry.object_key])
    struct.pack_into("<I", data, entry.offset + 4 + 16, 2**32 - 1)  # n_kg after magic, log id
    store.objects[entry.object_key] = bytes(data)
    with pytest.raises(CorruptObject, match="does not fit"):
        await read_all(store, make_handle([entry], 0, 1), [1])
    assert store.requests == [(entry.object_key, entry.offset, LOG_FIXED_SIZE)]


@pytest.mark.asyncio
async def test_large_section_ranged_path_matches_whole_path(
    store: MemoryObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = {
        sqn: {kg: [bytes([kg, sqn]) * 5000 for _ in range(8)] for kg in range(16)}
        for sqn in range(2)
    }
    entry = store.put_section("job/05/e", big, 2)
    assert entry.length > reader_mod.WHOLE_SECTION_READ_BYTES  # ~1.3 MB: ranged reads
    h = make_handle([entry], 0, 2)

    ranged = await read_all(store, h, [3, 11])
    ranged_bytes = store.fetched_bytes
    # one request per piece: fixed header, whole header, then one per wanted key group
    assert len(store.requests) == 2 + 2
    store.requests.clear()
    monkeypatch.setattr(reader_mod, "WHOLE_SECTION_READ_BYTES", 1 << 30)
    whole = await read_all(store, h, [3, 11])
    assert whole == ranged
    assert [(kg, sqn) for kg, sqn, _ in ranged] == [(3, 0), (3, 1), (11, 0), (11, 1)]
    assert ranged[0][2] == [bytes([3, 0]) * 5000] * 8
    assert len(store.requests) == 1 and store.fetched_bytes == entry.length
    # the ranged path read about 2 of 16 key groups, not the whole section
    assert ranged_bytes < entry.length / 4


@pytest.mark.asyncio
async def test_ranged_requests_are_per_key_group(
    store: MemoryObjects,
    two_entries: tuple[HandleEntry, HandleEntry],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reader_mod, "WHOLE_SECTION_READ_BYTES", 0)
    h = make_handle(two_entries, 0, 6)
    ranged = await read_all(store, h, [1, 9])
    # per entry: the fixed header prefix, the full header, then one block per wanted kg
    assert len(store.requests) == 2 * (2 + 2)
    monkeypatch.setattr(reader_mod, "WHOLE_SECTION_READ_BYTES", 1 << 20)
    store.requests.clear()
    assert await read_all(store, h, [1, 9]) == ranged
    assert len(store.requests) == 2


@pytest.mark.asyncio
async def test_reading_all_key_groups_reads_whole_sections(
    store: MemoryObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a key-group filter there is nothing to skip: one request per section."""
    monkeypatch.setattr(reader_mod, "WHOLE_SECTION_READ_BYTES", 0)
    entry = store.put_section("job/06/f", {0: {1: [b"a"], 2: [b"b"]}}, 1)
    assert len(await read_all(store, make_handle([entry], 0, 1))) == 2
    assert store.requests == [(entry.object_key, entry.offset, entry.length)]


@pytest.mark.asyncio
async def test_forwarded_section_reads_the_same(store: MemoryObjects) -> None:
    """A section copied into a parent's object at another offset reads unchanged."""
    entry = store.put_section("job/07/g", {0: {3: [b"x", b"y"]}, 1: {4: [b"z"]}}, 2)
    raw = store.objects[entry.object_key][entry.offset : entry.offset + entry.length]
    moved = build_object(
        [
            encode_log_section(
                OTHER_LOG, [FormatChangeset(0, {0: [pack_changes([b"pad" * 50])]})], 1
            ),
            EncodedSection(LOG, entry.first_sqn, entry.end_sqn, [raw], entry.length),
        ]
    )
    store.objects["parent/00/m"] = moved.data
    off, length = moved.placements[1]
    assert off != entry.offset
    forwarded = HandleEntry("parent/00/m", off, length, entry.first_sqn, entry.end_sqn)
    assert await read_all(store, make_handle([forwarded], 0, 2)) == await read_all(
        store, make_handle([entry], 0, 2)
    )
