"""What a writer call carries, and what the memory budget charges for it.

A call's changes come as key-group parts (:class:`ChangePart`), one message
each, or packed in one message (:class:`~dstl_server.packed_call.PackedCall`);
:func:`parts_of` says which (:data:`CallParts`). The budget
charges each part its bytes plus :data:`PART_OVERHEAD_BYTES`, when it is
admitted (:func:`charge_of`) and when it is appended and later freed
(:func:`held_bytes`), so the two counts agree exactly. The checks of a part's
shape (:func:`well_formed` for a whole call in C loops, :func:`check_part` for one
part's typed error), and :func:`check_call`, which checks a whole call into
:class:`CheckedParts`, are here too. Pure; any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, islice
from operator import attrgetter, lt
from typing import Protocol

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import ChangeTooLarge, InvalidArgument, KeyGroupOutOfRange
from dstl_client.core.format import (
    CHAIN_CRC_PIECE_BYTES,
    MAX_PARTS_PER_REQUEST,
    Changeset,
    PackedChanges,
    PackedGroups,
    check_packed,
    split_parts,
)
from dstl_server.packed_call import PackedCall

#: what the sidecar holds per appended key-group part beyond its bytes (the
#: part object, its two bytes objects and its list/dict slots), charged to the
#: memory budget so that many tiny parts cannot hold memory the budget misses
PART_OVERHEAD_BYTES = 256

_key_group_of = attrgetter("key_group")
_count_of = attrgetter("count")
_sizes_of = attrgetter("sizes")
_payload_of = attrgetter("payload")


class ChangePart(Protocol):
    """One key group's changes as a call carries them (``dstl.v1.KeyGroupChanges``).

    ``sizes`` holds ``count`` little-endian u32 lengths, ``payload`` the
    changes back to back: the on-disk encoding, never split into changes.
    """

    @property
    def key_group(self) -> int: ...

    @property
    def count(self) -> int: ...

    @property
    def sizes(self) -> bytes: ...

    @property
    def payload(self) -> bytes: ...


#: a call's parts as the writer path passes them: the repeated form or the packed one
CallParts = Sequence[ChangePart] | PackedCall


def parts_of(call: pb.AppendRequest | pb.PersistRequest) -> CallParts:
    """The parts ``call`` carries, in the form it sent them (typed error: both forms)."""
    if not call.HasField("packed"):
        return call.changes
    if len(call.changes):
        raise InvalidArgument("a call carries its changes as key-group parts or packed, not both")
    return PackedCall(call.packed)


def carries_changes(parts: CallParts) -> bool:
    """Whether a call's parts hold at least one change (a refused one fails its session)."""
    if isinstance(parts, PackedCall):
        return len(parts.sizes) > 0
    return any(p.count for p in parts)


def held_bytes(changeset: Changeset) -> int:
    """Bytes the budget charges for a changeset: data plus per-part overhead."""
    return changeset.nbytes + PART_OVERHEAD_BYTES * changeset.nparts


def charge_of(parts: CallParts) -> int:
    """What the budget charges for a call's parts: their bytes plus per-part overhead.

    The same as the registry charges when it appends them, so a call admitted
    with :meth:`~dstl_server.throttle.MemoryBudget.admitted` turns its hold
    into ``used`` exactly.
    """
    if isinstance(parts, PackedCall):
        return parts.nbytes + PART_OVERHEAD_BYTES * len(parts)
    # C loops: a bytes field of a request is read (copied) once, no Python frame per part
    items = list(parts)  # a request's list makes an object per element per pass
    data = sum(map(len, map(_sizes_of, items))) + sum(map(len, map(_payload_of, items)))
    return data + PART_OVERHEAD_BYTES * len(parts)


def well_formed(counts: list[int], sizes: list[bytes], payloads: list[bytes], limit: int) -> bool:
    """Whether every part is well formed: at least one change, ``4 * count`` bytes of
    sizes, sizes adding up to its payload, no change over ``limit`` bytes.

    C loops only: the running totals of sizes bytes and of payload bytes agree with
    those of the counts at every part's end exactly when each part's do.
    """
    if min(counts) < 1:
        return False
    ends = list(accumulate(counts))
    if list(accumulate(map(len, sizes))) != list(map((4).__mul__, ends)):
        return False
    every = struct.unpack(f"<{ends[-1]}I", b"".join(sizes))
    if max(every) > limit:
        return False
    total_at = [0, *accumulate(every)]
    return list(map(total_at.__getitem__, ends)) == list(accumulate(map(len, payloads)))


def check_part(kg: int, packed: PackedChanges, limit: int) -> None:
    """The full check of one part (typed errors); the one-change part has a fast path."""
    try:
        check_packed(packed, limit)
    except ValueError as exc:
        cls = ChangeTooLarge if "exceeds the limit" in str(exc) else InvalidArgument
        raise cls(f"key group {kg}: {exc}") from None
    if not packed.count:
        raise InvalidArgument(f"key group {kg}: a part must hold at least one change")


@dataclass(frozen=True, slots=True)
class CheckedParts:
    """A call's parts, every one checked: (key group, changes) in call order, or a packed
    call's key groups (strictly ascending) with their changes as :class:`PackedGroups`.

    ``nbytes``: their sizes and payload; ``count``: their changes; ``charge``:
    what the memory budget charges for them (``nbytes`` + per-part overhead).
    """

    parts: list[tuple[int, PackedChanges]] | PackedGroups
    nbytes: int
    count: int

    @property
    def charge(self) -> int:
        return self.nbytes + PART_OVERHEAD_BYTES * len(self.parts)


def check_key_group(key_group: int, key_group_range: tuple[int, int], log_id: str) -> None:
    first, last = key_group_range
    if not first <= key_group <= last:
        raise KeyGroupOutOfRange(
            f"key group {key_group} is outside writer {log_id}'s range [{first}, {last}]"
        )


def check_count(parts: CallParts) -> None:
    """At most :data:`~dstl_client.core.format.MAX_PARTS_PER_REQUEST` parts in one call."""
    if len(parts) > MAX_PARTS_PER_REQUEST:
        raise InvalidArgument(
            f"{len(parts)} key-group parts in one request (at most "
            f"{MAX_PARTS_PER_REQUEST}): send the buffer in several requests"
        )


def check_call(
    parts: CallParts, key_group_range: tuple[int, int], log_id: str, limit: int
) -> CheckedParts:
    """Check every part of a call before any is applied (typed errors).

    At least one part; each key group in the writer's range, each change at
    most ``limit`` bytes, sizes matching the payload, no empty part: the whole
    call at once by :func:`well_formed` (or a packed call's totals and
    bounds); a call that fails is checked part by part (by
    :func:`check_part`), for the first bad part's error.
    """
    if not parts:
        raise InvalidArgument("empty append batch")
    if isinstance(parts, PackedCall):
        return _check_packed(parts, key_group_range, log_id, limit)
    # each field read once (a bytes field of a request is a new object per read)
    items = list(parts)  # a request's list makes an object per element per pass
    kgs = list(map(_key_group_of, items))
    counts = list(map(_count_of, items))
    sizes = list(map(_sizes_of, items))
    payloads = list(map(_payload_of, items))
    packed = list(map(PackedChanges, counts, sizes, payloads))
    first_kg, last_kg = key_group_range
    if min(kgs) < first_kg or max(kgs) > last_kg or not well_formed(counts, sizes, payloads, limit):
        _check_each(kgs, packed, key_group_range, log_id, limit)
    nbytes = sum(map(len, sizes)) + sum(map(len, payloads))
    return CheckedParts(list(zip(kgs, packed, strict=True)), nbytes, sum(counts))


def _check_packed(
    call: PackedCall, key_group_range: tuple[int, int], log_id: str, limit: int
) -> CheckedParts:
    """:func:`check_call` of a packed call: totals and bounds over all parts at once.
    Small parts of key groups strictly ascending (what clients send) stay packed,
    as :class:`PackedGroups`: no object per part."""
    kgs, counts, sizes = call.arrays()
    first_kg, last_kg = key_group_range
    ascending = all(map(lt, kgs, islice(kgs, 1, None)))
    low, high = (kgs[0], kgs[-1]) if ascending else (min(kgs), max(kgs))
    largest = max(sizes) if sizes else 0
    if low < first_kg or high > last_kg or min(counts) < 1 or largest > limit:
        split = split_parts(counts, sizes, call.sizes, call.payload)
        _check_each(kgs, split, key_group_range, log_id, limit)
    if ascending and call.nbytes < CHAIN_CRC_PIECE_BYTES * 3 * len(kgs):
        # small parts (a checkpoint's), each key group once: kept packed, to be
        # encoded once when they become a changeset; large ones keep their own bytes
        groups = PackedGroups(kgs, counts, sizes, call.sizes, call.payload)
        return CheckedParts(groups, call.nbytes, len(sizes))
    split = split_parts(counts, sizes, call.sizes, call.payload)
    return CheckedParts(list(zip(kgs, split, strict=True)), call.nbytes, len(sizes))


def _check_each(
    kgs: list[int],
    packed: list[PackedChanges],
    key_group_range: tuple[int, int],
    log_id: str,
    limit: int,
) -> None:
    """Check the parts one by one, in call order: the first bad one raises its error."""
    for kg, part in zip(kgs, packed, strict=True):
        check_key_group(kg, key_group_range, log_id)
        check_part(kg, part, limit)
