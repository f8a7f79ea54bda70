"""Bulk state access for Arrow: read N keys, write N changes, with no Python work per key.

The per-key state API (:class:`~dstl_client.state.backend.KeyedStateBackend`)
pays a Python call and a SQLite statement per key. A vectorized caller holds
its keys and changes as Arrow columns instead, and moves them through the
node-local store a chunk at a time:

* :func:`read_rows`: the current value of every row address ``(kg, k)`` of
  a table, as :meth:`LocalKeyedStore.get` gives it (the pending batch, if
  asked, overriding the main version; missing and deleted rows null),
  aligned to the input rows;
* :func:`write_rows`: upserts and deletes (``v`` null) into the pending
  batch, as :meth:`LocalKeyedStore.write_delta` writes them (the last change
  of a key wins); ``merge_delta`` marks the changed key groups as for the
  per-key path.

Both sort the rows by ``(kg, k)`` in Arrow (so SQLite walks its B-trees in
order), cut them into chunks of at most ``chunk_rows`` rows, and hand each
chunk to the store as one statement over packed parameters
(:mod:`.packed_rows`): the encoding is Arrow compute kernels only; the one
step per row left in Python is the C-level fetch of read values. Cost is
proportional to the rows touched: each is one index seek in ``delta`` and
one in ``kv``, never a scan (``loadtest/bench_store_bulk.py`` measures it).

Callers: the task that owns the store (see :class:`LocalKeyedStore`), on
its thread; the writes go into the store's open transaction.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.core.errors import InvalidArgument, KeyGroupOutOfRange
from dstl_client.state.packed_rows import (
    KG_SHIFT,
    MAX_KEY_BYTES,
    PAD,
    VALUE_WIDTH,
    PackedKeys,
    PackedRows,
)
from dstl_client.state.store import LocalKeyedStore

#: column names of the tables read and written
KG, K, V = "kg", "k", "v"
#: rows per statement (measured 5 k to 100 k: within 10 %, 50 k the fastest)
DEFAULT_CHUNK_ROWS = 50_000
#: key and value bytes per statement (the packed format addresses 16 MiB of keys)
_CHUNK_BYTES = MAX_KEY_BYTES - 1

ROWS_SCHEMA = pa.schema([(KG, pa.int32(), False), (K, pa.binary(), False), (V, pa.binary())])
_SORT = [(KG, "ascending"), (K, "ascending")]


def read_rows(
    store: LocalKeyedStore,
    keys: pa.Table,
    *,
    with_delta: bool = True,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> pa.Table:
    """``(kg, k, v)`` of every row of ``keys`` (columns ``kg``, ``k``), in input order.

    ``v`` is null for a key with no value (or deleted in the pending batch,
    when ``with_delta``). Duplicate keys are read once per occurrence.
    """
    kg, k = _key_columns(store, keys)
    if not len(k):
        return ROWS_SCHEMA.empty_table()
    order = pc.sort_indices(pa.table({KG: kg, K: k}), sort_keys=_SORT)
    skg, sk = kg.take(order), k.take(order)
    values: list[bytes | None] = []
    for start, end in _chunks(sk, None, chunk_rows):
        packed = _pack_keys(skg.slice(start, end - start), sk.slice(start, end - start))
        values.extend(store.get_packed(packed, with_delta))
    # the inverse of a permutation is its sort order
    v = pa.array(values, pa.binary()).take(pc.sort_indices(order))
    return pa.Table.from_arrays([kg, k, v], schema=ROWS_SCHEMA)


def write_rows(
    store: LocalKeyedStore, rows: pa.Table, *, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> list[int]:
    """Write ``rows`` (``kg``, ``k``, ``v``; ``v`` null: delete) into the pending batch.

    Opens the store's transaction if none is open. Of several rows of one
    key the last wins. Returns the key groups written, in order.
    """
    kg, k = _key_columns(store, rows)
    if V not in rows.column_names:
        raise InvalidArgument(f"the rows to write have no {V!r} column")
    v = _binary(rows.column(V), V)
    store.begin()
    if not len(k):
        return []
    order = pc.sort_indices(pa.table({KG: kg, K: k}), sort_keys=_SORT)
    kg, k, v = kg.take(order), k.take(order), v.take(order)
    n = len(k)
    if n > 1:  # keep the last row of each key (the sort is stable)
        head, tail = slice(0, n - 1), slice(1, n)
        same = pc.and_(pc.equal(kg[head], kg[tail]), pc.equal(k[head], k[tail]))
        keep = pc.invert(pa.concat_arrays([same, pa.array([False])]))
        kg, k, v = kg.filter(keep), k.filter(keep), v.filter(keep)
    for start, end in _chunks(k, v, chunk_rows):
        size = end - start
        keys = _pack_keys(kg.slice(start, size), k.slice(start, size))
        store.write_delta_packed(_pack_values(keys, v.slice(start, size)))
    return list(pc.unique(kg).to_pylist())


def _key_columns(store: LocalKeyedStore, table: pa.Table) -> tuple[pa.Array, pa.Array]:
    """The ``kg`` (int32) and ``k`` (binary) columns, checked: no nulls, groups in range."""
    for name in (KG, K):
        if name not in table.column_names:
            raise InvalidArgument(f"the key table has no {name!r} column")
    kg_col = table.column(KG)
    if not pa.types.is_integer(kg_col.type):
        raise InvalidArgument(f"column {KG!r} must be integers, not {kg_col.type}")
    kg = _array(kg_col)
    k = _binary(table.column(K), K)
    if kg.null_count or k.null_count:
        raise InvalidArgument(f"columns {KG!r} and {K!r} must not hold nulls")
    if len(kg):
        if pc.max(pc.binary_length(k)).as_py() >= MAX_KEY_BYTES:
            raise InvalidArgument(f"a row key of {MAX_KEY_BYTES} bytes or more")
        bounds = pc.min_max(kg).as_py()
        r = store.kg_range
        if bounds["min"] < r.first or bounds["max"] > r.last:
            raise KeyGroupOutOfRange(
                f"key groups {bounds['min']}..{bounds['max']} are not all in this store's range {r}"
            )
    return kg.cast(pa.int32()), k


def _array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _binary(column: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    arr = _array(column)
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        raise InvalidArgument(f"column {name!r} must be binary, not {arr.type}")
    return arr.cast(pa.binary())


def _chunks(k: pa.Array, v: pa.Array | None, rows: int) -> list[tuple[int, int]]:
    """``(start, end)`` row ranges of at most ``rows`` rows and about ``_CHUNK_BYTES`` bytes."""
    n = len(k)
    sizes = pc.binary_length(k)
    if v is not None:
        sizes = pc.add(sizes, pc.fill_null(pc.binary_length(v), 0))
    total = pc.cumulative_sum(pc.cast(sizes, pa.int64()))
    bounds: list[tuple[int, int]] = []
    start, before = 0, 0
    while start < n:
        # the running total is sorted: the rows within budget are a prefix
        fits = pc.sum(pc.less_equal(total, before + _CHUNK_BYTES)).as_py()
        end = min(start + rows, max(fits, start + 1))  # one row at least
        bounds.append((start, end))
        before = total[end - 1].as_py()
        start = end
    return bounds


def _pack_keys(kg: pa.Array, k: pa.Array) -> PackedKeys:
    starts, lengths = _slots(k)
    x = pc.bit_wise_or(pc.shift_left(kg.cast(pa.int64()), KG_SHIFT), pc.shift_left(starts, 24))
    return PackedKeys(len(k), _json_array(pc.bit_wise_or(x, lengths)), _data(k) + PAD)


def _pack_values(keys: PackedKeys, v: pa.Array) -> PackedRows:
    starts, lengths = _slots(v)
    y = pc.if_else(pc.is_valid(v), pc.bit_wise_or(pc.shift_left(starts, 32), lengths), -1)
    text = pc.utf8_lpad(pc.cast(y, pa.string()), width=VALUE_WIDTH, padding=" ")
    return PackedRows(keys, _data(text.cast(pa.binary())), _data(v) + PAD)


def _offsets(arr: pa.Array) -> pa.Array:
    """The ``len + 1`` offsets (int64) of a binary array's items in its data buffer."""
    buffer = arr.buffers()[1]
    offsets = pa.Array.from_buffers(pa.int32(), len(arr) + 1, [None, buffer], offset=arr.offset)
    return offsets.cast(pa.int64())


def _slots(arr: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``(start, length)`` of each item of a binary array within :func:`_data` of it."""
    offsets = _offsets(arr)
    n = len(arr)
    starts = pc.subtract(offsets.slice(0, n), offsets[0])
    return starts, pc.subtract(offsets.slice(1, n), offsets.slice(0, n))


def _data(arr: pa.Array) -> bytes:
    """The bytes of a binary array's items, back to back."""
    offsets = _offsets(arr)
    first, last = offsets[0].as_py(), offsets[len(arr)].as_py()
    data = arr.buffers()[2]
    if data is None or last == first:
        return b""
    return data.slice(first, last - first).to_pybytes()  # type: ignore[no-any-return]


def _json_array(x: pa.Array) -> str:
    """Integers as the text of a JSON array."""
    items = pc.binary_join_element_wise(pc.cast(x, pa.string()), "", ",")  # "x," each
    return "[" + _data(items.cast(pa.binary()))[:-1].decode("ascii") + "]"
