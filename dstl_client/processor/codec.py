"""A compact, deterministic binary encoding of rows, compiled from a Spark schema.

State values of a processor are tuples (or ``Row``\\ s) of a ``StructType``,
as in Spark's ``transformWithState``; :class:`RowCodec` turns them into bytes
and back without pickle, so a checkpoint restores in any process and any
Python version. The layout follows the schema (nothing about it is stored)::

    struct   null bitmap (ceil(n/8) bytes, bit i = field i is null), then each non-null field
    byte/short/int/long, date (days), timestamp[_ntz] (microseconds)
             zigzag varint
    float / double    IEEE-754 little-endian, 4 / 8 bytes
    boolean  one byte
    string   varint length + UTF-8;  binary: varint length + bytes
    decimal  unscaled value: varint length + two's complement, big-endian (scale from the schema)
    array    varint count + null bitmap + each non-null element
    map      varint count + entries sorted by their key's bytes (key, then a presence
             byte and the value), so equal maps give equal bytes
    void     nothing

Equal values give equal bytes (map state keys are looked up by their bytes).
A value is a tuple, list or ``Row`` (by position) or a dict (by field name);
NumPy and pandas scalars are taken as their Python values. A top-level
value of another iterable type is taken as the tuple of its items, as
Spark's state clients do (a ``str`` ``"k"`` is the row ``("k",)`` of a
one-field schema; ``"key"`` has three fields and is refused). Decoded rows
are plain tuples (:meth:`RowCodec.loads`) or a ``Row`` with the schema's
field names (:meth:`RowCodec.loads_row`); nested structs decode as
``Row``\\ s, arrays as lists and maps as dicts, as Spark's state clients
return them.

A field stores a value of its type, or one its type holds exactly: NumPy
and pandas scalars, a NumPy array in an array field (as a list), a whole
``float`` in an integer field, an ``int`` in a float, double or decimal
field, ``0`` / ``1`` in a boolean field. Anything else (``1.7`` in an
integer field, a ``str`` in a number field, ``(key, value)`` pairs in a map
field, an integer out of the field's range) raises
:class:`~dstl_client.core.errors.InvalidArgument` naming the field, where
Spark 4.3 stores ``null`` (or the integer's low bits) without a word: a
value is kept as given or refused, never lost. A codec is immutable: safe
from any thread.

The scalar fields' encodings are in :mod:`.scalar_codecs`; structs, arrays
and maps, and the dispatch by type, are here.
"""

from __future__ import annotations

from typing import Any

from dstl_client.core.errors import InvalidArgument
from dstl_client.processor.scalar_codecs import Decoder, Encoder, plain, scalar_codec
from dstl_client.processor.schema import as_struct
from dstl_client.state.serializers import decode_varint, encode_varint


def _bitmap_size(n: int) -> int:
    return (n + 7) // 8


def _struct_codec(struct_type: Any, *, as_row: bool = True) -> tuple[Encoder, Decoder]:
    """A struct's codec; it decodes as a ``Row`` with its field names (``as_row``) or a tuple."""
    from pyspark.sql import Row

    names = [f.name for f in struct_type.fields]
    make_row = Row(*names) if as_row else None
    parts = [_codec(f.dataType) for f in struct_type.fields]
    nullable = [f.nullable for f in struct_type.fields]
    encs = [p[0] for p in parts]
    decs = [p[1] for p in parts]
    n = len(parts)
    size = _bitmap_size(n)
    shape = ", ".join(names)

    def enc(value: Any, out: bytearray) -> None:
        if isinstance(value, dict):
            unknown = set(value) - set(names)
            if unknown:
                raise InvalidArgument(f"fields {sorted(unknown)} are not in ({shape})")
            items = [value.get(name) for name in names]
        elif isinstance(value, tuple | list):
            if len(value) != n:
                hint = ""
                if all(isinstance(v, str) and len(v) == 1 for v in value):
                    hint = " (a str is taken as its characters, as in Spark: pass a tuple)"
                raise InvalidArgument(
                    f"a value of ({shape}) has {n} fields, not {len(value)}: {value!r}{hint}"
                )
            items = list(value)
        else:
            raise InvalidArgument(
                f"a value of ({shape}) is a tuple, Row or dict, not {type(value).__name__}"
            )
        start = len(out)
        out += bytes(size)
        for i, item in enumerate(items):
            item = plain(item)
            if item is None:
                if not nullable[i]:
                    raise InvalidArgument(f"field {names[i]!r} is not nullable")
                out[start + i // 8] |= 1 << (i % 8)
                continue
            try:
                encs[i](item, out)
            except InvalidArgument as exc:
                raise InvalidArgument(f"field {names[i]!r}: {exc.message}") from None

    def dec(data: bytes, pos: int) -> tuple[Any, int]:
        bitmap = data[pos : pos + size]
        if len(bitmap) != size:
            raise InvalidArgument("truncated value")
        pos += size
        items: list[Any] = []
        for i in range(n):
            if bitmap[i // 8] & (1 << (i % 8)):
                items.append(None)
            else:
                value, pos = decs[i](data, pos)
                items.append(value)
        return (tuple(items) if make_row is None else make_row(*items)), pos

    return enc, dec


def _array_codec(array_type: Any) -> tuple[Encoder, Decoder]:
    enc_e, dec_e = _codec(array_type.elementType)

    def enc(value: Any, out: bytearray) -> None:
        value = plain(value)
        if hasattr(value, "tolist") and not isinstance(value, list | tuple):
            value = value.tolist()
        if not isinstance(value, list | tuple):
            raise InvalidArgument(f"array needs a list, not {type(value).__name__}")
        out += encode_varint(len(value))
        start = len(out)
        out += bytes(_bitmap_size(len(value)))
        for i, item in enumerate(value):
            item = plain(item)
            if item is None:
                out[start + i // 8] |= 1 << (i % 8)
            else:
                enc_e(item, out)

    def dec(data: bytes, pos: int) -> tuple[Any, int]:
        n, pos = decode_varint(data, pos)
        size = _bitmap_size(n)
        bitmap = data[pos : pos + size]
        if len(bitmap) != size:
            raise InvalidArgument("truncated value")
        pos += size
        items: list[Any] = []
        for i in range(n):
            if bitmap[i // 8] & (1 << (i % 8)):
                items.append(None)
            else:
                item, pos = dec_e(data, pos)
                items.append(item)
        return items, pos

    return enc, dec


def _map_codec(map_type: Any) -> tuple[Encoder, Decoder]:
    enc_k, dec_k = _codec(map_type.keyType)
    enc_v, dec_v = _codec(map_type.valueType)

    def enc(value: Any, out: bytearray) -> None:
        if not isinstance(value, dict):
            hint = ""
            if isinstance(value, list) and all(isinstance(e, tuple) and len(e) == 2 for e in value):
                # what a Row's map column holds (both engines); Spark 4.3 stores null for it
                hint = " (a Row's map column holds (key, value) pairs: pass dict(value))"
            raise InvalidArgument(f"map needs a dict, not {type(value).__name__}{hint}")
        entries: list[tuple[bytes, bytes]] = []
        for k, v in value.items():
            k = plain(k)
            if k is None:
                raise InvalidArgument("a map key cannot be null")
            kb = bytearray()
            enc_k(k, kb)
            vb = bytearray()
            v = plain(v)
            if v is None:
                vb.append(0)
            else:
                vb.append(1)
                enc_v(v, vb)
            entries.append((bytes(kb), bytes(vb)))
        entries.sort()
        out += encode_varint(len(entries))
        for key_bytes, value_bytes in entries:
            out += key_bytes
            out += value_bytes

    def dec(data: bytes, pos: int) -> tuple[Any, int]:
        n, pos = decode_varint(data, pos)
        result: dict[Any, Any] = {}
        for _ in range(n):
            k, pos = dec_k(data, pos)
            if pos >= len(data):
                raise InvalidArgument("truncated value")
            present = data[pos]
            pos += 1
            if present:
                v, pos = dec_v(data, pos)
            else:
                v = None
            result[k] = v
        return result, pos

    return enc, dec


def _codec(dtype: Any) -> tuple[Encoder, Decoder]:
    from pyspark.sql import types as T

    scalar = scalar_codec(dtype)
    if scalar is not None:
        return scalar
    if isinstance(dtype, T.ArrayType):
        return _array_codec(dtype)
    if isinstance(dtype, T.MapType):
        return _map_codec(dtype)
    if isinstance(dtype, T.StructType):
        return _struct_codec(dtype)
    raise InvalidArgument(f"state values of type {dtype.simpleString()} are not supported")


def _iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


class RowCodec:
    """Encodes the rows of one schema (see the module documentation).

    Invariant: ``loads(dumps(v)) == v`` (as tuples) and equal values give equal
    bytes. Immutable: any thread may use it.
    """

    __slots__ = ("_dec", "_dec_row", "_enc", "schema")

    def __init__(self, schema: Any) -> None:
        self.schema = as_struct(schema)
        self._enc, self._dec = _struct_codec(self.schema, as_row=False)
        self._dec_row = _struct_codec(self.schema)[1]

    def dumps(self, value: Any) -> bytes:
        """``value`` (tuple, list, ``Row``, dict, or another iterable: its items) as bytes."""
        if not isinstance(value, tuple | list | dict) and _iterable(value):
            value = tuple(value)  # as Spark's clients: tuple(value) before the schema
        out = bytearray()
        self._enc(value, out)
        return bytes(out)

    def loads_row(self, data: bytes) -> Any:
        """The value :meth:`dumps` encoded, as a ``Row`` with the schema's field names."""
        value, pos = self._dec_row(data, 0)
        if pos != len(data):
            raise InvalidArgument("trailing bytes after a row")
        return value

    def loads(self, data: bytes) -> tuple[Any, ...]:
        """The tuple :meth:`dumps` encoded."""
        value, pos = self._dec(data, 0)
        if pos != len(data):
            raise InvalidArgument("trailing bytes after a row")
        return value  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"RowCodec({self.schema.simpleString()})"
