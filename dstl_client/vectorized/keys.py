"""Keys of vectorized state: key bytes, key groups and state row keys, as Arrow columns.

**Key bytes** are those of every other API (:func:`dstl_client.keygroups.key_bytes`):
the UTF-8 of the key's string form (an integer key is its decimal digits),
exactly what Spark's ``cast(cast(key AS STRING) AS BINARY)`` gives, so the
key group ``crc32(key bytes) % max_parallelism`` of a stored row is the one
the routing sends the key's rows to, in any run and at any parallelism
(rescale). Encoding and decoding are Arrow casts (no Python per key).

**Key groups**: each input row carries its key group, computed in SQL by the
driver (:data:`KG_COLUMN`, the routing's expression); due timers carry
theirs from the store. A key the function names that is in neither (an
upsert of another key) gets its key group from ``zlib.crc32`` in Python,
per such key only.

**Row keys** follow :mod:`dstl_client.state.changes`: ``varint(len(name))
name varint(len(key)) key [suffix]`` with reserved names (``$`` is refused
for user state names, so they never collide):

``$vstate``        the key's state row (value: :mod:`.values`)
``$vtimer-index``  per key group (empty key): ``ms key`` → ``b""`` (sorted by time)
``$vttl-index``    per key group (empty key): ``ms key`` → ``b""`` (sorted by expiry)

A time is :func:`encode_ms` (8 bytes, big-endian, sign bit flipped: byte order
is time order). Pure functions: any thread.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.core.errors import InvalidArgument, KeyGroupOutOfRange
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.changes import map_prefix
from dstl_client.state.serializers import encode_varint

#: the key group of each input row, added by the driver (SQL, the routing's expression)
KG_COLUMN = "__dstl_vkg"

STATE_NAME = b"$vstate"
#: every state row key starts with it, then ``varint(len(key)) key``
STATE_HEAD = encode_varint(len(STATE_NAME)) + STATE_NAME
TIMER_INDEX_PREFIX = map_prefix(b"$vtimer-index", b"")
TTL_INDEX_PREFIX = map_prefix(b"$vttl-index", b"")

TIME_BYTES = 8
_OFFSET = 1 << 63
MIN_MS = -(1 << 63)
MAX_MS = (1 << 63) - 1
_U64 = struct.Struct(">Q")


def encode_ms(ms: int) -> bytes:
    """A signed 64-bit time as 8 bytes that sort like the times."""
    return _U64.pack(ms + _OFFSET)


def index_bound(prefix: bytes, up_to_ms: int) -> bytes | None:
    """Exclusive end of the index entries at or before ``up_to_ms`` (``None``: all)."""
    return None if up_to_ms >= MAX_MS else prefix + encode_ms(up_to_ms + 1)


# ------------------------------------------------------------------ key bytes
def key_bytes_of(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The key bytes (binary) of a string or integer key column."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.null_count:
        raise InvalidArgument("a key column holds nulls")
    if pa.types.is_integer(arr.type):
        arr = pc.cast(arr, pa.string())
    elif not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        raise InvalidArgument(f"a key is a string or an integer, not {arr.type}")
    return pc.cast(pc.cast(arr, pa.string()), pa.binary())


def keys_from_bytes(data: pa.Array, key_type: pa.DataType) -> pa.Array:
    """The key column (``key_type``) of key bytes: the inverse of :func:`key_bytes_of`."""
    text = pc.cast(data, pa.string())
    return pc.cast(text, key_type)


def _with_length(prefix: bytes, data: pa.Array, suffix_of: pa.Array | None = None) -> pa.Array:
    """``prefix varint(len(item)) item [suffix]`` of every item (binary)."""
    lengths = pc.binary_length(data).to_numpy(zero_copy_only=False)
    n = len(data)
    if n and int(lengths.max()) >= 0x80:  # long keys: their varints in Python (rare)
        heads = pa.array([encode_varint(int(x)) for x in lengths], pa.binary())
    else:
        offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32).tobytes())
        body = pa.py_buffer(lengths.astype(np.uint8).tobytes())
        heads = pa.Array.from_buffers(pa.binary(), n, [None, offsets, body])
    parts = [pa.scalar(prefix, pa.binary()), heads, data]
    if suffix_of is not None:
        parts.append(suffix_of)
    return pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))


def state_row_keys(key_bytes: pa.Array) -> pa.Array:
    """The ``$vstate`` row key of each key."""
    return _with_length(STATE_HEAD, key_bytes)


def times_bytes(ms: pa.Array) -> pa.Array:
    """:func:`encode_ms` of each time (int64), as 8-byte binaries."""
    values = ms.to_numpy(zero_copy_only=False).astype(np.int64)
    raw = (values.view(np.uint64) ^ np.uint64(_OFFSET)).astype(">u8").tobytes()
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(TIME_BYTES), len(values), [None, pa.py_buffer(raw)]
    )
    return fixed.cast(pa.binary())


def index_row_keys(prefix: bytes, ms: pa.Array, key_bytes: pa.Array) -> pa.Array:
    """``prefix ms key`` of each (time, key): a timer or TTL index row."""
    return pc.binary_join_element_wise(
        pa.scalar(prefix, pa.binary()), times_bytes(ms), key_bytes, pa.scalar(b"", pa.binary())
    )


def split_index_rows(prefix: bytes, rows: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``(ms int64, key bytes)`` of index row keys (the inverse of :func:`index_row_keys`)."""
    n = len(prefix)
    stamp = pc.binary_slice(rows, n, n + TIME_BYTES)
    if not len(rows):
        return pa.array([], pa.int64()), pa.array([], pa.binary())
    offsets = np.frombuffer(stamp.buffers()[1], np.int32, len(stamp) + 1, stamp.offset * 4)
    data = np.frombuffer(stamp.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    ms = (data.view(">u8").astype(np.uint64) ^ np.uint64(_OFFSET)).view(np.int64)
    return pa.array(ms, pa.int64()), pc.binary_slice(rows, n + TIME_BYTES)


# ---------------------------------------------------------------- key groups
def lookup_key_groups(
    key_bytes: pa.Array,
    known_bytes: pa.Array,
    known_kgs: pa.Array,
    kg_range: KeyGroupRange,
    max_parallelism: int,
) -> pa.Array:
    """The key group (int32) of each key: from the known keys, else ``crc32`` (per such key).

    Raises :class:`KeyGroupOutOfRange` for a key outside ``kg_range`` (the
    function named a key another task owns).
    """
    found = pc.index_in(key_bytes, value_set=known_bytes)
    kgs = pc.take(known_kgs, found) if len(known_kgs) else pa.nulls(len(key_bytes), pa.int32())
    if kgs.null_count:
        missing = pc.is_null(kgs)
        others = pc.filter(key_bytes, missing).to_pylist()
        computed = iter([zlib.crc32(b) % max_parallelism for b in others])
        filled = [next(computed) if g is None else g for g in kgs.to_pylist()]
        kgs = pa.array(filled, pa.int32())
    if len(kgs):
        bounds = pc.min_max(kgs).as_py()
        if bounds["min"] < kg_range.first or bounds["max"] > kg_range.last:
            raise KeyGroupOutOfRange(
                f"the function named a key of key group {bounds['min']}..{bounds['max']}, "
                f"outside this task's range {kg_range}: only keys of its rows, its state "
                "or keys routed to it may be written"
            )
    return kgs.cast(pa.int32())
