"""The dstl object format: one definition, used by the sidecar to write and by
every reader to read.

An object holds the changes of several logs (writers) of one job, uploaded in
one flush. All integers are little-endian.

::

    object   := header  log_section*  footer
    header   := "DSTL" u16 version u16 flags u32 reserved  u32 crc32c(previous 12 bytes)
    footer   := u32 n_logs  (16s log_id  u64 offset  u64 length)*n_logs  u32 crc32c
                u32 footer_length  "LTSD"

    log_section := log_header  kg_block*
    log_header  := "LOG1" 16s log_id u32 n_kg u64 first_sqn u64 end_sqn
                   (u32 key_group u64 offset u64 length)*n_kg   u32 crc32c
    kg_block    := changeset*  u32 crc32c(changesets)
    changeset   := u64 sqn u32 count u64 payload_length  (u32 size)*count  payload

Offsets inside a log section are relative to the section's first byte, so a
section is self-contained: a forwarding parent can concatenate sections
encoded by its children into one object without re-encoding them, and a
handle entry is just (object key, section offset, section length). The
key-group index makes one key group's changes one contiguous byte range
(``offset``, ``length`` of its kg_block), readable with a ranged GET.

Every section is checksummed with CRC32C. A reader that finds a bad checksum
or an inconsistent length raises :class:`~dstl_client.core.errors.CorruptObject`;
it never returns data from a damaged section.

The module is pure functions over bytes; it may be called from any thread.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import crc32c as _crc32c

from dstl_client.core.errors import CorruptObject

FORMAT_VERSION = 1

OBJECT_MAGIC = b"DSTL"
FOOTER_MAGIC = b"LTSD"
LOG_MAGIC = b"LOG1"

_OBJ_HEADER = struct.Struct("<4sHHI")  # magic, version, flags, reserved
OBJECT_HEADER_SIZE = _OBJ_HEADER.size + 4
_LOG_FIXED = struct.Struct("<4s16sIQQ")  # magic, log_id, n_kg, first_sqn, end_sqn
_LOG_INDEX = struct.Struct("<IQQ")  # key_group, offset, length
_CHANGESET = struct.Struct("<QIQ")  # sqn, count, payload_length
_FOOTER_ENTRY = struct.Struct("<16sQQ")
_U32 = struct.Struct("<I")
_TRAILER = struct.Struct("<I4s")
_FOUR = (4).__mul__


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``crc``."""
    return int(_crc32c.crc32c(data, crc))


#: a key-group block whose pieces (changeset heads, sizes, payloads) average at
#: least this many bytes has its CRC chained over them (no copy of the block);
#: a block of smaller pieces is joined for one CRC call (fewer Python calls)
CHAIN_CRC_PIECE_BYTES = 4096

#: most ``KeyGroupChanges`` parts one Append or PersistDurably request may carry:
#: the sidecar's work per request stays bounded (clients send their buffer
#: before it holds more key groups than this)
MAX_PARTS_PER_REQUEST = 16_384
#: most writer requests one ``Mux`` stream message may carry (a client coalesces
#: no more; their parts together stay within :data:`MAX_PARTS_PER_REQUEST`)
MAX_CALLS_PER_MESSAGE = 1024


@dataclass(slots=True)
class PackedChanges:
    """Changes of one key group packed as on disk: ``count`` u32 sizes + payload.

    This is the unit that travels in ``KeyGroupChanges`` and that the sidecar
    stores without looking at single changes.
    """

    count: int
    sizes: bytes
    payload: bytes

    @property
    def nbytes(self) -> int:
        return len(self.sizes) + len(self.payload)


def pack_changes(changes: Sequence[bytes]) -> PackedChanges:
    """Pack a list of changes (tests, small callers; the client packs incrementally)."""
    sizes = struct.pack(f"<{len(changes)}I", *(len(c) for c in changes))
    return PackedChanges(len(changes), sizes, b"".join(changes))


def check_packed(packed: PackedChanges, max_change_bytes: int) -> None:
    """Validate that ``packed`` is well formed, in C-speed operations only.

    Raises :class:`ValueError` with a reason; callers wrap it in a typed error.
    """
    sizes_bytes = packed.sizes
    if packed.count == 1 and len(sizes_bytes) == 4:  # the usual part: one change
        (size,) = _U32.unpack(sizes_bytes)
        if size == len(packed.payload) and size <= max_change_bytes:
            return
    if len(packed.sizes) != 4 * packed.count:
        raise ValueError(f"sizes holds {len(packed.sizes)} bytes for {packed.count} changes")
    if packed.count == 0:
        if packed.payload:
            raise ValueError("payload without changes")
        return
    sizes = struct.unpack(f"<{packed.count}I", packed.sizes)
    if sum(sizes) != len(packed.payload):
        raise ValueError(f"sizes add up to {sum(sizes)} bytes, payload has {len(packed.payload)}")
    largest = max(sizes)
    if largest > max_change_bytes:
        raise ValueError(f"a change of {largest} bytes exceeds the limit of {max_change_bytes}")


def split_changes(
    count: int, sizes: bytes | memoryview, payload: bytes | memoryview
) -> list[bytes]:
    """Turn packed changes back into a list of byte strings."""
    out: list[bytes] = []
    pos = 0
    mv = memoryview(payload)
    for size in struct.unpack(f"<{count}I", sizes):
        out.append(bytes(mv[pos : pos + size]))
        pos += size
    return out


def split_parts(
    counts: Sequence[int], sizes: Sequence[int], sizes_bytes: bytes, payload: bytes
) -> list[PackedChanges]:
    """Split packed parts (``counts[i]`` changes each, of ``sizes`` in ``sizes_bytes`` and
    ``payload``) into one :class:`PackedChanges` per part, with C loops over all parts.

    The caller has checked the totals: ``sum(counts)`` sizes, adding up to ``len(payload)``.
    """
    if len(counts) == 1:
        return [PackedChanges(counts[0], sizes_bytes, payload)]
    starts, ends, first, last = _part_bounds(counts, sizes)
    sizes_of = map(sizes_bytes.__getitem__, map(slice, map(_FOUR, starts), map(_FOUR, ends)))
    payload_of = map(payload.__getitem__, map(slice, first, last))
    return list(map(PackedChanges, counts, sizes_of, payload_of))


def _part_bounds(
    counts: Sequence[int], sizes: Sequence[int]
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Each part's first and end change index, and its payload's first and end offset."""
    ends = list(accumulate(counts))
    starts = [0, *ends[:-1]]
    at = [0, *accumulate(sizes)]  # payload offset before each change
    return starts, ends, list(map(at.__getitem__, starts)), list(map(at.__getitem__, ends))


class PackedGroups(Mapping[int, Sequence[PackedChanges]]):
    r"""A changeset of one packed call: one part per key group, the key groups strictly
    ascending, encoded once, under the changeset's SQN, into its section's entries.

    Built from the call's arrays, then :meth:`seal`\ ed by the writer log when
    it becomes a changeset (in the append's turn, so a persist's section is
    only a header and a join away: the encoding of a checkpoint's changes is
    off the persist's path). Sealing makes each key group's changeset entry
    (head, sizes, payload) and its CRC, then drops the arrays: the bytes are
    held once. Read as a mapping (key group to its one part, once sealed), it
    slices the part out of the entry. Invariants, checked by whoever builds
    one: key groups strictly ascending, every count at least 1, ``sum(counts)``
    sizes in ``sizes_bytes`` adding up to ``len(payload)``. Mutated by
    :meth:`seal` only, once, in the writer's turn (event loop); read by any thread after.
    """

    __slots__ = ("_arrays", "_crcs", "_entries", "counts", "key_groups", "sqn")

    def __init__(
        self,
        key_groups: list[int],
        counts: Sequence[int],
        sizes: Sequence[int],
        sizes_bytes: bytes,
        payload: bytes,
    ) -> None:
        self.key_groups = key_groups
        self.counts = counts
        self._arrays: tuple[Sequence[int], bytes, bytes] | None = (sizes, sizes_bytes, payload)
        #: the SQN the entries were encoded under (-1: not sealed)
        self.sqn = -1
        self._entries: list[bytes] = []
        self._crcs: list[bytes] = []

    def split(self) -> list[tuple[int, PackedChanges]]:
        """The parts, (key group, changes) in key-group order."""
        if self._arrays is None:
            return [(kg, self._part(i)) for i, kg in enumerate(self.key_groups)]
        parts = split_parts(self.counts, *self._arrays)
        return list(zip(self.key_groups, parts, strict=True))

    def seal(self, sqn: int) -> None:
        """Encode every key group's entry under ``sqn`` (the changeset's) and its CRC."""
        if self._arrays is None:
            raise ValueError(f"packed changes already sealed under SQN {self.sqn}")
        sizes, sizes_bytes, payload = self._arrays
        counts = self.counts
        starts, ends, first, last = _part_bounds(counts, sizes)
        head = _CHANGESET.pack
        self._entries = entries = [
            head(sqn, count, end - begin) + sizes_bytes[4 * s : 4 * e] + payload[begin:end]
            for count, s, e, begin, end in zip(counts, starts, ends, first, last, strict=True)
        ]
        self._crcs = list(map(_U32.pack, map(_crc32c.crc32c, entries)))
        self.sqn = sqn
        self._arrays = None

    def entries(self, sqn: int) -> tuple[list[bytes], list[bytes]]:
        """Each key group's entry under ``sqn`` and its packed CRC, in key-group order."""
        if self._arrays is not None or sqn != self.sqn:
            raise ValueError(f"packed changes sealed under SQN {self.sqn}, not {sqn}")
        return self._entries, self._crcs

    def _part(self, i: int) -> PackedChanges:
        count = self.counts[i]
        entry = self._entries[i]
        cut = _CHANGESET.size + 4 * count
        return PackedChanges(count, entry[_CHANGESET.size : cut], entry[cut:])

    def __getitem__(self, key_group: int) -> Sequence[PackedChanges]:
        if self._arrays is not None:  # only a changeset is read as a mapping: sealed
            raise ValueError("packed changes are read as a mapping once sealed")
        i = bisect_left(self.key_groups, key_group)
        if i == len(self.key_groups) or self.key_groups[i] != key_group:
            raise KeyError(key_group)
        return (self._part(i),)

    def __iter__(self) -> Iterator[int]:
        return iter(self.key_groups)

    def __len__(self) -> int:
        return len(self.key_groups)


@dataclass(slots=True)
class Changeset:
    """One closed changeset of one writer: SQN and its changes per key group.

    Closed: ``groups`` no longer changes, so its sizes are counted once.
    """

    sqn: int
    groups: Mapping[int, Sequence[PackedChanges]]
    _nbytes: int = field(default=-1, repr=False, compare=False)
    _nparts: int = field(default=-1, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        """Bytes of sizes and payload of every part (counted on first use)."""
        if self._nbytes < 0:
            self._nbytes = sum(p.nbytes for parts in self.groups.values() for p in parts)
        return self._nbytes

    @property
    def nparts(self) -> int:
        """How many parts (one per append of a key group) the changeset holds."""
        if self._nparts < 0:
            self._nparts = sum(len(parts) for parts in self.groups.values())
        return self._nparts


@dataclass(slots=True)
class EncodedSection:
    """An encoded log section as a list of chunks (joined only once, by the object)."""

    log_id: bytes
    first_sqn: int
    end_sqn: int
    chunks: list[bytes | memoryview]
    length: int


def encode_log_section(
    log_id: bytes, changesets: Sequence[Changeset], end_sqn: int
) -> EncodedSection:
    """Encode the changesets of one writer (ordered by SQN) as a log section.

    ``end_sqn`` is the exclusive upper bound of the section's SQN range.
    Sections of small parts (a checkpoint's changes) are written into one
    buffer (:func:`_encode_joined`: a few C calls per key group); sections of
    large parts (a materialization's) keep referring to the parts' own bytes
    (:func:`_encode_pieces`: no copy of the data). The same bytes either way.
    """
    if len(log_id) != 16:
        raise ValueError("log_id must be 16 bytes")
    if not changesets:
        raise ValueError("a log section needs at least one changeset")
    prev_sqn = changesets[0].sqn - 1
    nbytes = nparts = 0
    for cs in changesets:
        if cs.sqn >= end_sqn or cs.sqn <= prev_sqn:
            raise ValueError("changesets must be ordered by SQN and below end_sqn")
        prev_sqn = cs.sqn
        nbytes += cs.nbytes
        nparts += cs.nparts
    # a part is three pieces (changeset head, sizes, payload)
    if nbytes >= CHAIN_CRC_PIECE_BYTES * 3 * nparts:
        return _encode_pieces(log_id, changesets, end_sqn)
    return _encode_joined(log_id, changesets, end_sqn)


def _by_key_group(
    changesets: Sequence[Changeset],
) -> dict[int, list[tuple[int, Sequence[PackedChanges]]]]:
    """(SQN, parts) of every changeset per key group, in SQN order."""
    if len(changesets) == 1:  # a persist's section
        sqn = changesets[0].sqn
        return {kg: [(sqn, parts)] for kg, parts in changesets[0].groups.items()}
    by_kg: dict[int, list[tuple[int, Sequence[PackedChanges]]]] = {}
    for cs in changesets:
        sqn = cs.sqn
        for kg, parts in cs.groups.items():
            entry = by_kg.get(kg)
            if entry is None:
                by_kg[kg] = [(sqn, parts)]
            else:
                entry.append((sqn, parts))
    return by_kg


def _encode_joined(log_id: bytes, changesets: Sequence[Changeset], end_sqn: int) -> EncodedSection:
    """The section in one buffer: each key-group block's changesets joined into one bytes
    object, its CRC computed over that, and the blocks, CRCs and header joined (for
    ordered changesets, checked by the caller).

    Built for the checkpoint's section, one changeset of ~100 key groups of a part each:
    one comprehension makes the blocks, and C loops (``map``, ``accumulate``, extended
    slices, one ``struct`` call for the index) do the rest, so a key group costs a few C
    calls and hardly any bytecode.
    """
    groups = changesets[0].groups
    crcs: Iterable[bytes] | None = None
    if len(changesets) == 1 and isinstance(groups, PackedGroups):  # entries encoded already
        kgs = groups.key_groups
        blocks, crcs = groups.entries(changesets[0].sqn)
    elif len(changesets) == 1:  # a persist's section
        kgs = sorted(groups)
        blocks = _changeset_blocks(changesets[0], kgs)
    else:
        kgs, blocks = _merged_blocks(changesets)
    n = len(kgs)
    header_len = _LOG_FIXED.size + _LOG_INDEX.size * n + 4
    lengths = [len(block) + 4 for block in blocks]  # each with its CRC
    offsets = list(accumulate(lengths, initial=header_len))
    index: list[int] = [0] * (3 * n)  # (key group, block offset, block length) per block
    index[0::3] = kgs
    index[1::3] = offsets[:-1]
    index[2::3] = lengths
    first_sqn = changesets[0].sqn
    header = _LOG_FIXED.pack(LOG_MAGIC, log_id, n, first_sqn, end_sqn) + struct.pack(
        f"<{'IQQ' * n}", *index
    )
    pieces = [header, _U32.pack(crc32c(header))] * (n + 1)
    pieces[2::2] = blocks
    pieces[3::2] = map(_U32.pack, map(_crc32c.crc32c, blocks)) if crcs is None else crcs
    # one chunk: an object of many sections builds faster than from thousands of pieces
    return EncodedSection(log_id, first_sqn, end_sqn, [b"".join(pieces)], offsets[-1])


def _changeset_blocks(changeset: Changeset, kgs: Sequence[int]) -> list[bytes]:
    """The changeset's entry (head, sizes, payload) in the block of each key group of ``kgs``.

    Key groups of one part each (what a checkpoint's changeset holds): one
    comprehension, the head and the part's bytes joined. A changeset with a key
    group of several parts (or none) drops that and goes key group by key group,
    the same entry for a part alone, :func:`_entry` (its parts merged) for the others.
    """
    sqn = changeset.sqn
    head = _CHANGESET.pack
    parts_of = changeset.groups.__getitem__
    try:
        return [
            head(sqn, p.count, len(p.payload)) + p.sizes + p.payload for (p,) in map(parts_of, kgs)
        ]
    except ValueError:  # a key group whose parts are not exactly one
        pass
    blocks: list[bytes] = []
    for parts in map(parts_of, kgs):
        if len(parts) == 1:
            (p,) = parts
            blocks.append(head(sqn, p.count, len(p.payload)) + p.sizes + p.payload)
        else:
            blocks.append(_entry(sqn, parts))
    return blocks


def _entry(sqn: int, parts: Sequence[PackedChanges]) -> bytes:
    """One changeset in a key-group block: its parts merged under one head."""
    sizes = [p.sizes for p in parts]
    payloads = [p.payload for p in parts]
    head = _CHANGESET.pack(sqn, sum([p.count for p in parts]), sum(map(len, payloads)))
    return b"".join([head, *sizes, *payloads])


def _merged_blocks(changesets: Sequence[Changeset]) -> tuple[list[int], list[bytes]]:
    """Key groups (ascending) and their blocks (without CRC) of several changesets: the
    entries of one key group joined in SQN order."""
    entries: dict[int, list[bytes]] = {}
    for cs in changesets:
        kgs = list(cs.groups)
        for kg, entry in zip(kgs, _changeset_blocks(cs, kgs), strict=True):
            held = entries.get(kg)
            if held is None:
                entries[kg] = [entry]
            else:
                held.append(entry)
    kgs = sorted(entries)
    return kgs, list(map(b"".join, map(entries.__getitem__, kgs)))


def _encode_pieces(log_id: bytes, changesets: Sequence[Changeset], end_sqn: int) -> EncodedSection:
    """The section as a list of chunks referring to the parts' own bytes (no copy of the
    data; for ordered changesets, checked by the caller)."""
    first_sqn = changesets[0].sqn
    by_kg = _by_key_group(changesets)
    kgs = sorted(by_kg)
    header_len = _LOG_FIXED.size + _LOG_INDEX.size * len(kgs) + 4
    blocks: list[tuple[int, int, int, list[bytes | memoryview]]] = []
    offset = header_len
    pack_head = _CHANGESET.pack
    crc_of = _crc32c.crc32c
    for kg in kgs:
        # the block's CRC: chained over its pieces when they are large (a
        # materialization's parts: no copy of the block), else one call over a
        # copy of the block dropped at once (many small parts: one CRC call
        # rather than three per part); the same CRC either way, and the section
        # keeps referring to the parts' own bytes
        piece: list[bytes | memoryview] = []
        for sqn, parts in by_kg[kg]:
            if len(parts) == 1:
                p = parts[0]
                piece += (pack_head(sqn, p.count, len(p.payload)), p.sizes, p.payload)
            else:
                count = sum(p.count for p in parts)
                payload_len = sum(len(p.payload) for p in parts)
                piece.append(pack_head(sqn, count, payload_len))
                piece.extend(p.sizes for p in parts)
                piece.extend(p.payload for p in parts)
        length = sum(map(len, piece))
        if length >= CHAIN_CRC_PIECE_BYTES * len(piece):
            crc = 0
            for chunk in piece:
                crc = crc_of(chunk, crc)
        else:
            crc = crc_of(b"".join(piece))
        length += 4
        piece.append(_U32.pack(crc))
        blocks.append((kg, offset, length, piece))
        offset += length
    header = bytearray(_LOG_FIXED.pack(LOG_MAGIC, log_id, len(kgs), first_sqn, end_sqn))
    for kg, off, length, _ in blocks:
        header += _LOG_INDEX.pack(kg, off, length)
    header += _U32.pack(crc32c(header))
    all_chunks: list[bytes | memoryview] = [bytes(header)]
    for *_, chunks in blocks:
        all_chunks.extend(chunks)
    return EncodedSection(log_id, first_sqn, end_sqn, all_chunks, offset)


@dataclass(slots=True)
class BuiltObject:
    """A complete object and where each log section landed in it."""

    data: bytes
    #: (offset, length) per section, in the order the sections were added
    placements: list[tuple[int, int]] = field(default_factory=list)


def build_object(sections: Iterable[EncodedSection]) -> BuiltObject:
    """Concatenate log sections into one object with header and footer."""
    head = _OBJ_HEADER.pack(OBJECT_MAGIC, FORMAT_VERSION, 0, 0)
    chunks: list[bytes | memoryview] = [head, _U32.pack(crc32c(head))]
    offset = OBJECT_HEADER_SIZE
    placements: list[tuple[int, int]] = []
    footer = bytearray()
    n = 0
    for sec in sections:
        chunks.extend(sec.chunks)
        placements.append((offset, sec.length))
        footer += _FOOTER_ENTRY.pack(sec.log_id, offset, sec.length)
        offset += sec.length
        n += 1
    footer = bytearray(_U32.pack(n)) + footer
    footer += _U32.pack(crc32c(footer))
    chunks.append(bytes(footer))
    chunks.append(_TRAILER.pack(len(footer), FOOTER_MAGIC))
    return BuiltObject(b"".join(chunks), placements)


# --------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class LogSectionIndex:
    """The parsed header of a log section."""

    log_id: bytes
    first_sqn: int
    end_sqn: int
    header_length: int
    #: key group -> (offset, length) of its block, relative to the section start
    key_groups: Mapping[int, tuple[int, int]]


def log_header_length(prefix: bytes | memoryview) -> int:
    """Length of a log header, from its first ``LOG_FIXED_SIZE`` bytes."""
    if len(prefix) < _LOG_FIXED.size:
        raise CorruptObject("log section shorter than its fixed header")
    magic, _, n_kg, _, _ = _LOG_FIXED.unpack_from(prefix)
    if magic != LOG_MAGIC:
        raise CorruptObject(f"bad log section magic {bytes(magic)!r}")
    return int(_LOG_FIXED.size + _LOG_INDEX.size * n_kg + 4)


LOG_FIXED_SIZE = _LOG_FIXED.size


def parse_log_header(buf: bytes | memoryview, section_length: int | None = None) -> LogSectionIndex:
    """Parse and verify a log header at the start of ``buf``."""
    mv = memoryview(buf)
    hlen = log_header_length(mv)
    if len(mv) < hlen:
        raise CorruptObject(f"log header truncated: {len(mv)} of {hlen} bytes")
    (stored,) = _U32.unpack_from(mv, hlen - 4)
    if crc32c(mv[: hlen - 4]) != stored:
        raise CorruptObject("log header checksum mismatch")
    _, log_id, n_kg, first_sqn, end_sqn = _LOG_FIXED.unpack_from(mv)
    groups: dict[int, tuple[int, int]] = {}
    pos = _LOG_FIXED.size
    prev_end = hlen
    for _ in range(n_kg):
        kg, off, length = _LOG_INDEX.unpack_from(mv, pos)
        pos += _LOG_INDEX.size
        if off != prev_end or length < 4:
            raise CorruptObject(f"key group {kg}: block at {off}+{length} breaks the index")
        prev_end = off + length
        groups[kg] = (off, length)
    if section_length is not None and prev_end != section_length:
        raise CorruptObject(
            f"log section is {section_length} bytes but its index covers {prev_end}"
        )
    if end_sqn < first_sqn:
        raise CorruptObject("log section SQN range is inverted")
    return LogSectionIndex(bytes(log_id), first_sqn, end_sqn, hlen, groups)


def verify_log_section(buf: bytes | memoryview) -> LogSectionIndex:
    """Parse the log section ``buf`` and verify every checksum in it: header and blocks.

    The blocks' checksums only (C speed, nothing copied): a block whose
    checksum holds is read like one of this node's own sections. Raises
    :class:`CorruptObject` naming the first part that does not verify.
    """
    mv = memoryview(buf)
    index = parse_log_header(mv, len(mv))
    for kg, (off, length) in index.key_groups.items():
        (stored,) = _U32.unpack_from(mv, off + length - 4)
        if crc32c(mv[off : off + length - 4]) != stored:
            raise CorruptObject(f"key group {kg}: checksum mismatch")
    return index


@dataclass(frozen=True, slots=True)
class ChangesetView:
    """One changeset of one key group, as read: packed sizes and payload."""

    key_group: int
    sqn: int
    count: int
    sizes: bytes
    payload: bytes

    def changes(self) -> list[bytes]:
        return split_changes(self.count, self.sizes, self.payload)

    @property
    def nbytes(self) -> int:
        """Bytes of sizes and payload: what a message carrying it costs beyond its header."""
        return len(self.sizes) + len(self.payload)

    def split(self, max_bytes: int) -> Iterator[ChangesetView]:
        """This changeset as consecutive views of at most ``max_bytes`` each (sizes + payload).

        A changeset gathers every append of one key group between two persists,
        so it can outgrow one gRPC message; the pieces keep the SQN and the
        change order, and readers treat them as one changeset. A single change
        larger than ``max_bytes`` still gets a view of its own (the sidecar's
        settings keep ``max_change_bytes`` well below the message limit).
        """
        if self.nbytes <= max_bytes:
            yield self
            return
        sizes = struct.unpack(f"<{self.count}I", self.sizes)
        start = 0
        pos = 0
        while start < self.count:
            end = start
            used = 0
            while end < self.count and (end == start or used + 4 + sizes[end] <= max_bytes):
                used += 4 + sizes[end]
                end += 1
            length = used - 4 * (end - start)
            yield ChangesetView(
                self.key_group,
                self.sqn,
                end - start,
                self.sizes[4 * start : 4 * end],
                self.payload[pos : pos + length],
            )
            pos += length
            start = end


def parse_kg_block(key_group: int, block: bytes | memoryview) -> Iterator[ChangesetView]:
    """Verify a key-group block and yield its changesets in SQN order."""
    mv = memoryview(block)
    if len(mv) < 4:
        raise CorruptObject(f"key group {key_group}: block truncated")
    (stored,) = _U32.unpack_from(mv, len(mv) - 4)
    body = mv[: len(mv) - 4]
    if crc32c(body) != stored:
        raise CorruptObject(f"key group {key_group}: checksum mismatch")
    views: list[ChangesetView] = []
    pos = 0
    last_sqn = -1
    while pos < len(body):
        if pos + _CHANGESET.size > len(body):
            raise CorruptObject(f"key group {key_group}: changeset header truncated")
        sqn, count, payload_len = _CHANGESET.unpack_from(body, pos)
        pos += _CHANGESET.size
        end = pos + 4 * count + payload_len
        if end > len(body) or sqn <= last_sqn:
            raise CorruptObject(f"key group {key_group}: changeset at SQN {sqn} is inconsistent")
        sizes = bytes(body[pos : pos + 4 * count])
        payload = bytes(body[pos + 4 * count : end])
        if count and sum(struct.unpack(f"<{count}I", sizes)) != payload_len:
            raise CorruptObject(f"key group {key_group}: sizes do not match payload at SQN {sqn}")
        views.append(ChangesetView(key_group, sqn, count, sizes, payload))
        last_sqn = sqn
        pos = end
    return iter(views)


@dataclass(frozen=True, slots=True)
class ObjectIndex:
    """The footer of an object: which log sections it holds."""

    version: int
    sections: Mapping[bytes, tuple[int, int]]


def parse_object(data: bytes | memoryview) -> ObjectIndex:
    """Verify an object's header and footer (not the sections) and index it."""
    mv = memoryview(data)
    if len(mv) < OBJECT_HEADER_SIZE + _TRAILER.size + 8:
        raise CorruptObject("object too short")
    magic, version, _flags, _ = _OBJ_HEADER.unpack_from(mv)
    if magic != OBJECT_MAGIC:
        raise CorruptObject(f"not a dstl object (magic {bytes(magic)!r})")
    (stored,) = _U32.unpack_from(mv, _OBJ_HEADER.size)
    if crc32c(mv[: _OBJ_HEADER.size]) != stored:
        raise CorruptObject("object header checksum mismatch")
    if version != FORMAT_VERSION:
        raise CorruptObject(f"unsupported object format version {version}")
    flen, tmagic = _TRAILER.unpack_from(mv, len(mv) - _TRAILER.size)
    if (
        tmagic != FOOTER_MAGIC
        or flen < 8  # n_logs + crc32c
        or flen + _TRAILER.size + OBJECT_HEADER_SIZE > len(mv)
    ):
        raise CorruptObject("object trailer missing or truncated")
    fstart = len(mv) - _TRAILER.size - flen
    footer = mv[fstart : fstart + flen]
    (fcrc,) = _U32.unpack_from(footer, flen - 4)
    if crc32c(footer[: flen - 4]) != fcrc:
        raise CorruptObject("object footer checksum mismatch")
    (n,) = _U32.unpack_from(footer)
    if 4 + n * _FOOTER_ENTRY.size + 4 != flen:
        raise CorruptObject("object footer length inconsistent")
    sections: dict[bytes, tuple[int, int]] = {}
    for i in range(n):
        log_id, off, length = _FOOTER_ENTRY.unpack_from(footer, 4 + i * _FOOTER_ENTRY.size)
        if off + length > fstart:
            raise CorruptObject("object footer points past the sections")
        sections[bytes(log_id)] = (off, length)
    return ObjectIndex(version, sections)


def verify_object(data: bytes | memoryview) -> ObjectIndex:
    """Verify every checksum of a whole object (used by tools and tests)."""
    index = parse_object(data)
    mv = memoryview(data)
    for off, length in index.sections.values():
        sec = mv[off : off + length]
        hdr = parse_log_header(sec, length)
        for kg, (koff, klen) in hdr.key_groups.items():
            for _ in parse_kg_block(kg, sec[koff : koff + klen]):
                pass
    return index
