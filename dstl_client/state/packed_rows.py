"""Many state rows as a few SQL parameters: the wire format of the store's bulk paths.

The bulk reads and writes of :class:`~dstl_client.state.store.LocalKeyedStore`
hand SQLite the rows of a whole chunk in one statement, with no Python call
per row (no parameter set bound per row as ``executemany`` does). A chunk
of rows travels as a few parameters, which SQLite's own ``json_each`` and
``substr`` turn back into rows inside the statement:

* ``:x``: a JSON array with one integer per row,
  ``kg << 48 | start << 24 | length``, where ``kg[start:start + length]``
  of ``:k`` is the row key (so a chunk holds less than 16 MiB of keys, a
  key group is below 32768);
* ``:k``: the row keys back to back, plus one byte (:data:`PAD`; SQLite's
  ``substr`` of a zero-length BLOB is NULL, so the BLOB is never empty);
* for writes, ``:y``: per row ``start << 32 | length`` of its value in
  ``:v`` as :data:`VALUE_WIDTH` ASCII characters (right-aligned), or ``-1``
  for a delete; ``:v``: the values back to back, plus :data:`PAD`.

``json_each`` yields the rows in array order with ``key`` the row's index.
The keys and values are BLOB slices, so a zero-length key or value stays a
zero-length BLOB (never NULL, never TEXT).

Measured (``loadtest/bench_store_bulk.py``, 100 k rows in a store of 1 M,
CPU time on 2 shared cores): generating the rows this way costs about a
third of a recursive CTE over fixed-width digits; the bulk read is ~1.4x
an ``executemany`` into a temporary table plus one join, the bulk write ~2x
an ``executemany`` of the rows.

This module knows the format only; the Arrow encoding is in :mod:`.bulk`,
the statements over the store's tables in :mod:`.store`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a key group fits in the bits above KG_SHIFT
KG_SHIFT = 48
#: chunks hold less than this many bytes of keys; no key is longer
MAX_KEY_BYTES = 1 << 24
#: characters of one value field of ``:y``
VALUE_WIDTH = 20
#: appended to every packed BLOB so that none is zero-length
PAD = b"\x00"


@dataclass(frozen=True, slots=True)
class PackedKeys:
    """Row addresses ``(kg, k)`` packed as the module docstring says (``x``, ``k``)."""

    count: int
    x: str
    k: bytes

    def params(self) -> dict[str, object]:
        return {"x": self.x, "k": self.k}


@dataclass(frozen=True, slots=True)
class PackedRows:
    """Changes ``(kg, k, value or delete)``: the keys, value fields ``y``, values ``v``."""

    keys: PackedKeys
    y: bytes
    v: bytes

    def params(self) -> dict[str, object]:
        return {**self.keys.params(), "y": self.y, "v": self.v}


_MASK = MAX_KEY_BYTES - 1
#: the key group of the row of ``json_each(:x)``
KG_EXPR = f"(value >> {KG_SHIFT})"
#: the row key of the row of ``json_each(:x)``
K_EXPR = f"substr(:k, ((value >> 24) & {_MASK}) + 1, value & {_MASK})"
#: the value of the row of ``json_each(:x)`` (NULL: a delete)
V_EXPR = (
    "(SELECT CASE WHEN y >= 0 THEN substr(:v, (y >> 32) + 1, y & 4294967295) END FROM "
    f"(SELECT CAST(substr(:y, key * {VALUE_WIDTH} + 1, {VALUE_WIDTH}) AS INTEGER) AS y))"
)
#: ``q(i, kg, k)``: the rows of a :class:`PackedKeys`, in order
KEYS_CTE = f"WITH q AS (SELECT key AS i, {KG_EXPR} AS kg, {K_EXPR} AS k FROM json_each(:x)) "
