"""Many state rows as a few SQL parameters: the wire format of the store's bulk paths.

The bulk reads and writes of :class:`~dstl_client.state.store.LocalKeyedStore`
hand SQLite the rows of a whole chunk in one statement, with no Python call
per row: neither a bound parameter set per row (``executemany``) nor a
fetched tuple per input row for the keys. A chunk of ``count`` rows travels
as a handful of BLOB parameters, and a recursive CTE (:data:`ROWS_CTE`)
turns them back into the rows ``q(i, kg, k[, v])`` inside SQLite:

* ``:kg``: each row's key group as ``KG_WIDTH`` ASCII digits, back to back;
* ``:ko``: the ``count + 1`` offsets of the rows' keys in ``:k`` as
  ``OFFSET_WIDTH`` ASCII digits each (row ``i`` is ``k[ko[i]:ko[i+1]]``);
* ``:k``: the keys back to back, plus one trailing byte (SQLite's ``substr``
  of a zero-length BLOB is NULL, so the parameter is never empty);
* for writes, ``:vo``/``:v`` the same for the values, and ``:present`` one
  byte per row, ``0x01`` for a value and ``0x00`` for a delete.

Every parameter is a BLOB, so ``substr`` seeks by byte offset in O(1) and
``CAST(<ASCII digits> AS INTEGER)`` parses a fixed-width field. A row with
a zero-length key or value stays a zero-length BLOB (never NULL, never TEXT).

This module knows the format only; the Arrow encoding is in
:mod:`.bulk`, the statements over the store's tables in :mod:`.store`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: digits of a key group (key groups are below 32768)
KG_WIDTH = 5
#: digits of a byte offset into one chunk's keys or values
OFFSET_WIDTH = 10
#: appended to every packed BLOB so that none is zero-length
PAD = b"\x00"


@dataclass(frozen=True, slots=True)
class PackedKeys:
    """``count`` row addresses ``(kg, k)`` packed as described in the module docstring."""

    count: int
    kg: bytes
    ko: bytes
    k: bytes

    def params(self) -> dict[str, object]:
        return {"n": self.count, "kg": self.kg, "ko": self.ko, "k": self.k}


@dataclass(frozen=True, slots=True)
class PackedRows:
    """``count`` changes ``(kg, k, v or delete)``: keys, value offsets, values, present flags."""

    keys: PackedKeys
    vo: bytes
    v: bytes
    present: bytes

    def params(self) -> dict[str, object]:
        return {**self.keys.params(), "vo": self.vo, "v": self.v, "present": self.present}


def _field(param: str, index: str, width: int) -> str:
    return f"CAST(substr(:{param}, {index} * {width} + 1, {width}) AS INTEGER)"


def _slice(blob: str, offsets: str) -> str:
    start = _field(offsets, "i", OFFSET_WIDTH)
    end = _field(offsets, "(i + 1)", OFFSET_WIDTH)
    return f"substr(:{blob}, {start} + 1, {end} - {start})"


#: ``q(i, kg, k)``: the rows of :class:`PackedKeys` in input order (``:n`` >= 1)
ROWS_CTE = (
    "WITH RECURSIVE r(i) AS (VALUES (0) UNION ALL SELECT i + 1 FROM r WHERE i + 1 < :n), "
    f"q AS MATERIALIZED (SELECT i, {_field('kg', 'i', KG_WIDTH)} AS kg, "
    f"{_slice('k', 'ko')} AS k FROM r) "
)

#: the value of row ``q.i`` of :class:`PackedRows` (NULL: a delete)
VALUE_EXPR = f"CASE substr(:present, q.i + 1, 1) WHEN X'01' THEN {_slice('v', 'vo')} END"
