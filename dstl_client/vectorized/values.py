"""The stored value of a key's vectorized state: one row of ``state_schema`` as bytes.

The on-disk and changelog format of vectorized state (stable; a change is a
new format byte)::

    value  := 0x01  expiry  nulls  fixed*  length*  var*
    expiry := int64 little-endian: the TTL expiry in ms (MAX_MS: none)
    nulls  := ceil(n / 8) bytes, bit i (LSB first) set: field i is null
    fixed  := each fixed-width field in schema order, little-endian
              (bool 1 byte, int8..int64, float32/64, date32 as int32 days,
              timestamp as int64 microseconds; a null field is zeros)
    length := uint32 little-endian byte length of each string/binary field, in order
    var    := the string (UTF-8) / binary fields' bytes back to back, in order

Every value has the expiry slot, so a query may add or drop its TTL between
runs. Encoding and decoding are NumPy / Arrow passes over all values of a
batch (no Python per value); a schema with another field type (decimal,
nested) is refused by :func:`check_state_schema`. Pure functions: any thread.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.core.errors import ConfigError, CorruptObject
from dstl_client.vectorized.keys import MAX_MS

FORMAT = 1


def _fixed_dtype(t: pa.DataType) -> str | None:
    """The little-endian NumPy dtype of a fixed-width field; ``None``: a var field."""
    if pa.types.is_boolean(t):
        return "u1"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return str(np.dtype(t.to_pandas_dtype()).newbyteorder("<").str)
    if pa.types.is_date32(t):
        return "<i4"
    if pa.types.is_timestamp(t):
        return "<i8"
    return None


def _is_var(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def check_state_schema(schema: pa.Schema) -> None:
    """Raise :class:`ConfigError` for a field type the value format does not hold."""
    for f in schema:
        if _fixed_dtype(f.type) is None and not _is_var(f.type):
            raise ConfigError(
                f"state field {f.name!r} is {f.type}: vectorized state holds booleans, "
                "integers, floats, dates, timestamps, strings and binaries"
            )
        if pa.types.is_timestamp(f.type) and f.type.unit != "us":
            raise ConfigError(f"state field {f.name!r}: timestamps are in microseconds")


class ValueCodec:
    """Encodes and decodes the values of one ``state_schema``. Immutable: any thread."""

    def __init__(self, schema: pa.Schema) -> None:
        check_state_schema(schema)
        self.schema = schema
        self.fixed = [i for i, f in enumerate(schema) if not _is_var(f.type)]
        self.var = [i for i, f in enumerate(schema) if _is_var(f.type)]
        n_bytes = (len(schema) + 7) // 8
        fields: list[tuple[str, str] | tuple[str, str, tuple[int]]] = [
            ("fmt", "u1"),
            ("expiry", "<i8"),
            ("nulls", "u1", (n_bytes,)),
        ]
        fields += [(f"f{i}", str(_fixed_dtype(schema.field(i).type))) for i in self.fixed]
        fields += [(f"l{i}", "<u4") for i in self.var]
        self.dtype = np.dtype(fields)
        self.width = self.dtype.itemsize
        self.n_bytes = n_bytes
        empty = pa.table({f.name: pa.nulls(1, f.type) for f in schema}, schema=schema)
        #: the value of a key without state (every field null, no expiry)
        self.empty = self.encode(empty, np.array([MAX_MS], np.int64))[0]

    # ------------------------------------------------------------- encode
    def encode(self, table: pa.Table, expiry: np.ndarray) -> pa.Array:
        """The values (binary) of ``table``'s rows (the schema's columns), with their expiry."""
        n = table.num_rows
        rec = np.zeros(n, self.dtype)
        rec["fmt"] = FORMAT
        rec["expiry"] = expiry
        nulls = np.zeros((n, self.n_bytes), np.uint8)
        var_data: list[pa.Array] = []
        for i, f in enumerate(self.schema):
            col = table.column(f.name).combine_chunks().cast(f.type)
            is_null = pc.is_null(col).to_numpy(zero_copy_only=False)
            nulls[:, i // 8] |= is_null.astype(np.uint8) << np.uint8(i % 8)
            if i in self.var:
                data = col.cast(pa.binary()).fill_null(b"")
                rec[f"l{i}"] = pc.binary_length(data).to_numpy(zero_copy_only=False)
                var_data.append(data)
            else:
                rec[f"f{i}"] = _fixed_numbers(col)
        rec["nulls"] = nulls
        head = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(self.width), n, [None, pa.py_buffer(rec.tobytes())]
        ).cast(pa.binary())
        if not var_data:
            return head
        return pc.binary_join_element_wise(head, *var_data, pa.scalar(b"", pa.binary()))

    # ------------------------------------------------------------- decode
    def decode(self, values: pa.Array) -> tuple[list[pa.Array], np.ndarray, np.ndarray]:
        """``(columns, present, expiry)`` of ``values`` (null: no state).

        ``columns`` are the schema's (null where the key has no state),
        ``present`` whether a value was stored, ``expiry`` its TTL expiry
        (``MAX_MS``: none). Raises :class:`CorruptObject` for a value of another format.
        """
        n = len(values)
        present = pc.is_valid(values).to_numpy(zero_copy_only=False)
        filled = pc.if_else(pc.is_valid(values), values, pa.scalar(self.empty.as_py(), pa.binary()))
        filled = filled.cast(pa.binary())
        offsets = np.frombuffer(filled.buffers()[1], np.int32, n + 1, filled.offset * 4)
        data_buffer = filled.buffers()[2]
        data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0)
        starts = offsets[:-1].astype(np.int64)
        if n and int((offsets[1:] - offsets[:-1]).min()) < self.width:
            raise CorruptObject("a vectorized state value is shorter than its header")
        heads = data[starts[:, None] + np.arange(self.width)] if n else np.zeros((0, self.width))
        rec = np.ascontiguousarray(heads, dtype=np.uint8).view(self.dtype).reshape(n)
        if n and bool((rec["fmt"] != FORMAT).any()):
            raise CorruptObject("a vectorized state value of an unknown format")
        nulls = rec["nulls"].reshape(n, self.n_bytes)
        pos = starts + self.width
        columns: list[pa.Array] = []
        for i, f in enumerate(self.schema):
            is_null = ((nulls[:, i // 8] >> np.uint8(i % 8)) & 1).astype(bool) | ~present
            if i in self.var:
                lengths = rec[f"l{i}"].astype(np.int64)
                columns.append(_var_column(data, pos, lengths, is_null, f.type))
                pos = pos + lengths
            else:
                columns.append(_fixed_column(rec[f"f{i}"], is_null, f.type))
        return columns, present, rec["expiry"].astype(np.int64)


def _fixed_numbers(col: pa.Array) -> np.ndarray:
    t = col.type
    if pa.types.is_boolean(t):
        col = pc.cast(col, pa.uint8())
    elif pa.types.is_timestamp(t):
        col = col.cast(pa.int64())
    elif pa.types.is_date32(t):
        col = col.cast(pa.int32())
    zero = pa.scalar(0, col.type)
    return np.asarray(col.fill_null(zero).to_numpy(zero_copy_only=False))


def _fixed_column(numbers: np.ndarray, is_null: np.ndarray, t: pa.DataType) -> pa.Array:
    if pa.types.is_boolean(t):
        return pa.array(numbers.astype(bool), pa.bool_(), mask=is_null)
    if pa.types.is_timestamp(t):
        return pa.array(numbers.astype(np.int64), pa.int64(), mask=is_null).cast(t)
    if pa.types.is_date32(t):
        return pa.array(numbers.astype(np.int32), pa.int32(), mask=is_null).cast(t)
    return pa.array(numbers, t, mask=is_null)


def _var_column(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, is_null: np.ndarray, t: pa.DataType
) -> pa.Array:
    """A string/binary column gathered from each value's ``[start, start + length)``."""
    n = len(starts)
    out_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    total = int(out_offsets[-1])
    index = np.repeat(starts - out_offsets[:-1], lengths) + np.arange(total)
    body = data[index].astype(np.uint8).tobytes() if total else b""
    plain = pa.binary() if pa.types.is_binary(t) or pa.types.is_large_binary(t) else pa.string()
    arr = pa.Array.from_buffers(
        plain, n, [None, pa.py_buffer(out_offsets.astype(np.int32).tobytes()), pa.py_buffer(body)]
    )
    valid = pa.array(~is_null, pa.bool_())
    return pc.if_else(valid, arr, pa.scalar(None, plain)).cast(t)
