"""Client-side batching of appends into a call's packed changes (``PackedParts``, or
``KeyGroupChanges`` parts for a sidecar that predates it)."""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate, chain
from operator import add, itemgetter

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import ChangeTooLarge, KeyGroupOutOfRange
from dstl_client.core.format import MAX_PARTS_PER_REQUEST

_LITTLE = sys.byteorder == "little"
if array("I").itemsize != 4:  # pragma: no cover - every platform we run on
    raise ImportError("dstl_client needs a 4-byte unsigned int array type")

#: upper bound of the protobuf framing of one ``KeyGroupChanges`` in a request,
#: beyond its sizes and payload bytes: five tags and five length/varint fields
PART_FRAMING_BYTES = 32

#: a run of changes as :meth:`ChangeBuffer.columns` gives them: key groups, changes, sizes
Columns = tuple[list[int], list[bytes], list[int]]

_first_of = itemgetter(0)
_second_of = itemgetter(1)
_FOUR_MORE = (4).__add__


class ChangeBuffer:
    """Changes appended since the last send, packed per key group.

    Appending costs two C-level appends per change (a packed run of changes,
    :meth:`add_packed`, two per run); :meth:`drain_to` fills a call with
    everything buffered: one ``PackedParts`` (four byte strings for all key
    groups, ``packed``) or, for a sidecar that does not accept it, one
    ``KeyGroupChanges`` per key group. ``nbytes`` counts the changes and their 4-byte sizes,
    ``framing`` an upper bound of the protobuf framing around them, so
    ``nbytes + framing`` bounds the encoded size of the drained messages.
    Not thread-safe: the owning writer holds its lock.
    """

    __slots__ = (
        "_first",
        "_last",
        "_max_change",
        "_payload",
        "_sizes",
        "count",
        "framing",
        "nbytes",
        "packed",
    )

    def __init__(
        self, key_group_range: tuple[int, int], max_change_bytes: int, *, packed: bool = True
    ) -> None:
        #: whether :meth:`drain_to` sends ``PackedParts`` (the sidecar accepts it)
        self.packed = packed
        self._first, self._last = key_group_range
        self._max_change = max_change_bytes
        self._sizes: dict[int, array[int]] = {}
        self._payload: dict[int, list[bytes]] = {}
        self.nbytes = 0
        self.framing = 0
        self.count = 0

    def check(self, key_group: int, size: int) -> None:
        if not self._first <= key_group <= self._last:
            raise KeyGroupOutOfRange(
                f"key group {key_group} is outside the writer's range [{self._first}, {self._last}]"
            )
        if size > self._max_change:
            raise ChangeTooLarge(
                f"a change of {size} bytes exceeds the limit of {self._max_change} bytes"
            )

    @property
    def parts(self) -> int:
        """Key groups buffered: one ``KeyGroupChanges`` part each in the request."""
        return len(self._sizes)

    def add(self, key_group: int, data: bytes) -> None:
        """Append one change (already checked)."""
        if type(data) is not bytes:  # kept by reference: never a buffer the caller may change
            data = bytes(data)
        sizes = self._sizes.get(key_group)
        if sizes is None:
            sizes = self._sizes[key_group] = array("I")
            self._payload[key_group] = []
            self.framing += PART_FRAMING_BYTES
        sizes.append(len(data))
        self._payload[key_group].append(data)
        self.nbytes += len(data) + 4
        self.count += 1

    def add_packed(self, key_group: int, sizes: array[int], payload: bytes) -> None:
        """Append a run of changes of one key group, packed (already checked).

        ``sizes`` (``array("I")``) are the changes' sizes, ``payload`` their bytes
        back to back: the same as ``add`` of each change in turn.
        """
        mine = self._sizes.get(key_group)
        if mine is None:
            mine = self._sizes[key_group] = array("I")
            self._payload[key_group] = []
            self.framing += PART_FRAMING_BYTES
        mine.extend(sizes)
        self._payload[key_group].append(payload)
        self.nbytes += len(payload) + 4 * len(sizes)
        self.count += len(sizes)

    def columns(self, items: Sequence[object]) -> Columns | None:
        """``items`` as key groups, changes and sizes when every one is a ``(key group,
        bytes)`` pair that :meth:`check` passes (C loops over all of them); else None
        (the caller goes change by change, for the first bad one's error)."""
        if set(map(type, items)) != {tuple} or set(map(len, items)) != {2}:  # type: ignore[arg-type]
            return None
        pairs: Sequence[tuple[int, bytes]] = items  # type: ignore[assignment]
        kgs = list(map(_first_of, pairs))
        datas = list(map(_second_of, pairs))
        if set(map(type, kgs)) != {int} or set(map(type, datas)) != {bytes}:
            return None
        lens = list(map(len, datas))
        if min(kgs) < self._first or max(kgs) > self._last or max(lens) > self._max_change:
            return None
        return kgs, datas, lens

    def add_run(self, columns: Columns, start: int, limit: int, room: int) -> int:
        """Append the changes of ``columns`` from ``start`` on that one by one would be added
        without a send before or after them (``ChangelogWriter.append``'s rules, with
        ``limit`` its batch size and ``room`` the request's); return how many (0: the next
        one needs a send first). The caller sends after the run when the batch is full.

        A change j of the run is added without a send before it when ``nbytes +
        framing + size`` stays within ``room``, bounded above by the run's bytes up to
        and including j plus 32 bytes of framing per change before it: monotone in j,
        so the run's end is a bisection (as is the batch limit's, which only the last
        change of the run may reach).
        """
        kgs, datas, lens = columns
        end = len(lens)
        ahead = list(accumulate(map(_FOUR_MORE, lens[start:end])))  # bytes after each
        fits = list(map(add, ahead, range(0, PART_FRAMING_BYTES * len(ahead), PART_FRAMING_BYTES)))
        take = min(
            bisect_right(fits, room - self.nbytes - self.framing),
            bisect_left(ahead, limit - self.nbytes) + 1,
            MAX_PARTS_PER_REQUEST - 1 - len(self._sizes),
            end - start,
        )
        if take <= 0:
            return 0
        sizes_of = self._sizes
        payload_of = self._payload
        new = 0
        stop = start + take
        for kg, data, size in zip(
            kgs[start:stop], datas[start:stop], lens[start:stop], strict=True
        ):
            sizes = sizes_of.get(kg)
            if sizes is None:
                sizes_of[kg] = array("I", (size,))
                payload_of[kg] = [data]
                new += 1
            else:
                sizes.append(size)
                payload_of[kg].append(data)
        self.framing += PART_FRAMING_BYTES * new
        self.nbytes += ahead[take - 1]
        self.count += take
        return take

    def drain_to(self, call: pb.AppendRequest | pb.PersistRequest) -> None:
        """Move everything buffered into ``call``: packed, or as parts (see the class)."""
        if not self._sizes:
            return  # a call without changes: neither field set
        if self.packed:
            self.drain_packed(call.packed)
        else:
            self.drain_into(call.changes)

    def drain_packed(self, packed: pb.PackedParts) -> None:
        """Move everything buffered into one ``PackedParts``, in key-group order.

        Four joins for all key groups: no message, and no Python step, per key group.
        """
        kgs = sorted(self._sizes)
        sizes = list(map(self._sizes.__getitem__, kgs))
        key_groups = array("I", kgs)
        counts = array("I", map(len, sizes))
        if not _LITTLE:  # pragma: no cover
            for a in (key_groups, counts, *sizes):
                a.byteswap()
        packed.key_groups = key_groups.tobytes()
        packed.counts = counts.tobytes()
        packed.sizes = b"".join(sizes)
        packed.payload = b"".join(chain.from_iterable(map(self._payload.__getitem__, kgs)))
        self._clear()

    def drain(self) -> list[pb.KeyGroupChanges]:
        """Take everything buffered as protobuf messages, in key-group order."""
        request = pb.AppendRequest()
        self.drain_into(request.changes)
        return list(request.changes)

    def drain_into(self, parts: RepeatedCompositeFieldContainer[pb.KeyGroupChanges]) -> None:
        """Move everything buffered into ``parts`` (a request's ``changes``), in key-group order.

        Each part is built in place in the request: its bytes are copied once.
        """
        for kg in sorted(self._sizes):
            sizes = self._sizes[kg]
            if not _LITTLE:  # pragma: no cover
                sizes.byteswap()
            parts.add(
                key_group=kg,
                count=len(sizes),
                sizes=sizes.tobytes(),
                payload=b"".join(self._payload[kg]),
            )
        self._clear()

    def _clear(self) -> None:
        self._sizes.clear()
        self._payload.clear()
        self.nbytes = 0
        self.framing = 0
        self.count = 0


def fit_sizes(sizes: array[int], start: int, free: int) -> tuple[int, int]:
    """``(end, payload bytes)``: the most changes from ``start`` on whose size and
    4-byte length fit in ``free`` bytes (``end == start`` when none does)."""
    rest = sizes[start:] if start else sizes
    total = sum(rest) + 4 * len(rest)
    if total <= free:
        return len(sizes), total - 4 * len(rest)
    used = 0
    end = start
    for size in rest:
        if used + size + 4 > free:
            break
        used += size + 4
        end += 1
    return end, used - 4 * (end - start)
