"""One key group's rows rebuilt in memory: its materialized part's rows, its changelog tail applied.

The decoding half of a restore (:mod:`dstl_client.state.restore` plans the
reads and writes the store): :func:`decode_part_rows` decodes a part's changeset
straight from the packed payload, :class:`KgTail` folds a tail as its
changesets arrive, :class:`KgRows` applies the changes a fold cannot. The
result is the same as replaying change by change through the keyed backend.
Each object is used by the one restoring thread that made it.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable

from dstl_client.core.errors import CorruptObject
from dstl_client.core.format import ChangesetView
from dstl_client.state.changes import (
    OP_DELETE,
    OP_DELETE_PREFIX,
    OP_LIST_APPEND,
    OP_PUT,
    decode_change,
)

__all__ = ["KgRows", "KgTail", "decode_part_rows"]


def decode_part_rows(kg: int, view: ChangesetView, pid: str) -> list[tuple[bytes, bytes]]:
    """The ``(k, v)`` rows of a materialized part's changeset (PUT records only)."""
    payload = view.payload
    out: list[tuple[bytes, bytes]] = []
    append = out.append
    pos = 0
    for size in struct.unpack(f"<{view.count}I", view.sizes):
        end = pos + size
        if size >= 2 and payload[pos] == OP_PUT and payload[pos + 1] < 0x80:
            ks = pos + 2
            ke = ks + payload[pos + 1]
            if ke > end:
                raise CorruptObject("state change key runs past its end")
            append((payload[ks:ke], payload[ke:end]))
        else:
            op, k, v = decode_change(payload[pos:end])
            if op != OP_PUT:
                raise CorruptObject(f"materialized part {pid} holds a change of type {op}")
            append((k, v))
        pos = end
    if pos != len(payload):
        raise CorruptObject(f"key group {kg}: sizes do not add up to the payload")
    return out


class KgRows:
    """One key group's rows in memory while its tail is applied.

    Applies changes as :meth:`KeyedStateBackend.apply_change` does: PUT and
    DELETE of a row (map entries included), DELETE_PREFIX drops every row
    starting with the prefix (a whole map), LIST_APPEND concatenates. A sorted
    index of the row keys is built at the first prefix delete only.
    """

    __slots__ = ("index", "rows")

    def __init__(self, rows: Iterable[tuple[bytes, bytes]]) -> None:
        self.rows: dict[bytes, bytes] = dict(rows)
        self.index: list[bytes] | None = None

    def apply(self, view: ChangesetView, first: int = 0, pos: int = 0) -> None:
        """Apply the view's changes from its ``first`` one on (at byte ``pos``)."""
        rows = self.rows
        payload = view.payload
        for size in struct.unpack_from(f"<{view.count - first}I", view.sizes, 4 * first):
            end = pos + size
            if size >= 2 and payload[pos] == OP_PUT and payload[pos + 1] < 0x80:
                ks = pos + 2
                ke = ks + payload[pos + 1]
                if ke > end:
                    raise CorruptObject("state change key runs past its end")
                k = payload[ks:ke]
                if self.index is not None and k not in rows:
                    bisect.insort(self.index, k)
                rows[k] = payload[ke:end]
            else:
                self._apply_slow(payload[pos:end])
            pos = end
        if pos != len(payload):
            raise CorruptObject(f"key group {view.key_group}: sizes do not add up to the payload")

    def _apply_slow(self, data: bytes) -> None:
        op, k, value = decode_change(data)
        rows = self.rows
        if op in (OP_PUT, OP_LIST_APPEND):
            old = rows.get(k)
            if old is None and self.index is not None:
                bisect.insort(self.index, k)
            rows[k] = value if op == OP_PUT or old is None else old + value
        elif op == OP_DELETE:
            if rows.pop(k, None) is not None and self.index is not None:
                del self.index[bisect.bisect_left(self.index, k)]
        elif op == OP_DELETE_PREFIX:
            if self.index is None:
                self.index = sorted(rows)
            lo = bisect.bisect_left(self.index, k)
            hi = lo
            while hi < len(self.index) and self.index[hi].startswith(k):
                del rows[self.index[hi]]
                hi += 1
            del self.index[lo:hi]


def _fold_puts(latest: dict[bytes, bytes], view: ChangesetView) -> tuple[int, int]:
    """Fold the view's leading PUTs into ``latest`` (a later PUT of a row replaces it).

    Returns ``(changes folded, their bytes)``: ``view.count`` and the payload's
    length when every change was a PUT (of a key shorter than 128 bytes), else
    the index and offset of the first change that was not folded.
    """
    payload = view.payload
    pos = 0
    i = 0
    for size in struct.unpack(f"<{view.count}I", view.sizes):
        end = pos + size
        if size < 2 or payload[pos] != OP_PUT or payload[pos + 1] >= 0x80:
            return i, pos
        ke = pos + 2 + payload[pos + 1]
        if ke > end:
            raise CorruptObject("state change key runs past its end")
        latest[payload[pos + 2 : ke]] = payload[ke:end]
        pos = end
        i += 1
    if pos != len(payload):
        raise CorruptObject(f"key group {view.key_group}: sizes do not add up to the payload")
    return i, pos


class KgTail:
    """One key group's changelog tail, folded as its changesets arrive (in order).

    While every change is a PUT (the usual case) only the last value of each
    row is kept (``latest``): changes a later one supersedes cost a dict
    store, and rebuilding is the part's rows updated with ``latest``. From
    the first other change on, the rest of the tail is kept (``rest``, with
    where to resume in its first changeset) and applied in order by
    :class:`KgRows` on top of the part's rows and ``latest``.
    """

    __slots__ = ("latest", "rest")

    def __init__(self) -> None:
        self.latest: dict[bytes, bytes] = {}
        self.rest: list[tuple[ChangesetView, int, int]] = []

    def add(self, view: ChangesetView) -> None:
        if self.rest:
            self.rest.append((view, 0, 0))
            return
        done, pos = _fold_puts(self.latest, view)
        if done < view.count:
            self.rest.append((view, done, pos))

    def rebuild(self, part_rows: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The key group's rows in ``k`` order: ``part_rows`` (``k`` order) with the tail applied."""
        if not self.rest:
            merged = dict(part_rows)
            merged.update(self.latest)
            # the part's keys come first, in order, then new keys: one merge for Timsort
            return sorted(merged.items())
        rows = KgRows(part_rows)
        rows.rows.update(self.latest)
        for view, first, pos in self.rest:
            rows.apply(view, first, pos)
        return sorted(rows.rows.items())
