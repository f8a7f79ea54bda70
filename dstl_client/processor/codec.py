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
"""

from __future__ import annotations

import datetime
import decimal
import reprlib
import struct
from collections.abc import Callable
from typing import Any

from dstl_client.core.errors import InvalidArgument
from dstl_client.processor.schema import as_struct
from dstl_client.state.serializers import decode_varint, encode_varint

Encoder = Callable[[Any, bytearray], None]
Decoder = Callable[[bytes, int], tuple[Any, int]]

_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_EPOCH = datetime.date(1970, 1, 1).toordinal()
_INT_BITS = {"ByteType": 8, "ShortType": 16, "IntegerType": 32, "LongType": 64}


def _plain(value: Any) -> Any:
    """NumPy / pandas scalars as Python values (duck-typed: no NumPy import).

    A NumPy array (``ndim`` at least 1, what pandas hands over for an array
    column) stays as it is: an array field takes it as a list
    (:func:`_array_codec`), any other field refuses it.
    """
    mod = type(value).__module__
    if mod.startswith("numpy") and hasattr(value, "item"):
        return value.item() if getattr(value, "ndim", 0) == 0 else value
    if mod.startswith("pandas"):
        if repr(value) in ("<NA>", "NaT"):
            return None
        if hasattr(value, "to_pydatetime"):
            return value.to_pydatetime()
        if hasattr(value, "to_pytimedelta"):
            return value.to_pytimedelta()
    return value


def _shown(value: Any) -> str:
    """``value`` for an error message: its type and a bounded ``repr``."""
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _zigzag(n: int, out: bytearray) -> None:
    """A signed 64-bit integer (days, microseconds) as a zigzag varint."""
    out += encode_varint((n << 1) ^ (n >> 63))


def _unzigzag(data: bytes, pos: int) -> tuple[int, int]:
    z, pos = decode_varint(data, pos)
    return (z >> 1) ^ -(z & 1), pos


def _int_encoder(bits: int, type_name: str) -> Encoder:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def enc(value: Any, out: bytearray) -> None:
        value = _plain(value)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise InvalidArgument(f"{type_name} needs an integer, not {_shown(value)}")
        if not low <= value <= high:
            raise InvalidArgument(f"{value} does not fit {type_name}")
        out += encode_varint((value << 1) ^ (value >> 63))

    return enc


def _float_encoder(fmt: struct.Struct, type_name: str) -> Encoder:
    def enc(value: Any, out: bytearray) -> None:
        value = _plain(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidArgument(f"{type_name} needs a number, not {_shown(value)}")
        try:
            out += fmt.pack(value)
        except (struct.error, OverflowError) as exc:
            raise InvalidArgument(f"{value!r} does not fit a {type_name}: {exc}") from None

    return enc


def _float_decoder(fmt: struct.Struct) -> Decoder:
    size = fmt.size

    def dec(data: bytes, pos: int) -> tuple[Any, int]:
        if pos + size > len(data):
            raise InvalidArgument("truncated value")
        return float(fmt.unpack_from(data, pos)[0]), pos + size

    return dec


def _enc_bool(value: Any, out: bytearray) -> None:
    value = _plain(value)
    if not (isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))):
        raise InvalidArgument(f"boolean needs a bool, not {_shown(value)}")
    out.append(1 if value else 0)


def _dec_bool(data: bytes, pos: int) -> tuple[Any, int]:
    if pos >= len(data):
        raise InvalidArgument("truncated value")
    return data[pos] != 0, pos + 1


def _enc_str(value: Any, out: bytearray) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"string needs a str, not {_shown(value)}")
    b = value.encode("utf-8")
    out += encode_varint(len(b))
    out += b


def _dec_str(data: bytes, pos: int) -> tuple[Any, int]:
    n, pos = decode_varint(data, pos)
    if pos + n > len(data):
        raise InvalidArgument("truncated value")
    return data[pos : pos + n].decode("utf-8"), pos + n


def _enc_bin(value: Any, out: bytearray) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgument(f"binary needs bytes, not {type(value).__name__}")
    b = bytes(value)
    out += encode_varint(len(b))
    out += b


def _dec_bin(data: bytes, pos: int) -> tuple[Any, int]:
    n, pos = decode_varint(data, pos)
    if pos + n > len(data):
        raise InvalidArgument("truncated value")
    return bytes(data[pos : pos + n]), pos + n


def _enc_date(value: Any, out: bytearray) -> None:
    value = _plain(value)
    if isinstance(value, datetime.datetime):
        value = value.date()
    if not isinstance(value, datetime.date):
        raise InvalidArgument(f"date needs a datetime.date, not {_shown(value)}")
    _zigzag(value.toordinal() - _EPOCH, out)


def _dec_date(data: bytes, pos: int) -> tuple[Any, int]:
    days, pos = _unzigzag(data, pos)
    return datetime.date.fromordinal(days + _EPOCH), pos


def _micros_codec(spark_type: Any, type_name: str) -> tuple[Encoder, Decoder]:
    """Timestamps as Spark's Python conversion gives them (``toInternal``/``fromInternal``)."""

    def enc(value: Any, out: bytearray) -> None:
        value = _plain(value)
        if not isinstance(value, datetime.datetime):
            raise InvalidArgument(f"{type_name} needs a datetime, not {_shown(value)}")
        _zigzag(int(spark_type.toInternal(value)), out)

    def dec(data: bytes, pos: int) -> tuple[Any, int]:
        micros, pos = _unzigzag(data, pos)
        return spark_type.fromInternal(micros), pos

    return enc, dec


_DECIMALS = decimal.Context(prec=100, rounding=decimal.ROUND_HALF_UP)


def _decimal_codec(precision: int, scale: int) -> tuple[Encoder, Decoder]:
    quantum = decimal.Decimal(1).scaleb(-scale)
    limit = 10**precision

    def enc(value: Any, out: bytearray) -> None:
        value = _plain(value)
        if isinstance(value, bool) or not isinstance(value, decimal.Decimal | int | float):
            raise InvalidArgument(f"decimal needs a Decimal, not {_shown(value)}")
        d = decimal.Decimal(value)
        if not d.is_finite():
            raise InvalidArgument(f"decimal cannot hold {value!r}")
        unscaled = int(d.quantize(quantum, context=_DECIMALS).scaleb(scale, context=_DECIMALS))
        if abs(unscaled) >= limit:
            raise InvalidArgument(f"{value!r} does not fit a decimal({precision},{scale})")
        size = max(1, (unscaled.bit_length() + 8) // 8)
        out += encode_varint(size)
        out += unscaled.to_bytes(size, "big", signed=True)

    def dec(data: bytes, pos: int) -> tuple[Any, int]:
        n, pos = decode_varint(data, pos)
        if pos + n > len(data):
            raise InvalidArgument("truncated value")
        unscaled = int.from_bytes(data[pos : pos + n], "big", signed=True)
        return decimal.Decimal(unscaled).scaleb(-scale, context=_DECIMALS), pos + n

    return enc, dec


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
            item = _plain(item)
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
        value = _plain(value)
        if hasattr(value, "tolist") and not isinstance(value, list | tuple):
            value = value.tolist()
        if not isinstance(value, list | tuple):
            raise InvalidArgument(f"array needs a list, not {type(value).__name__}")
        out += encode_varint(len(value))
        start = len(out)
        out += bytes(_bitmap_size(len(value)))
        for i, item in enumerate(value):
            item = _plain(item)
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
            k = _plain(k)
            if k is None:
                raise InvalidArgument("a map key cannot be null")
            kb = bytearray()
            enc_k(k, kb)
            vb = bytearray()
            v = _plain(v)
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


def _enc_void(value: Any, out: bytearray) -> None:
    raise InvalidArgument(f"void holds only None, not {value!r}")


def _dec_void(data: bytes, pos: int) -> tuple[Any, int]:
    return None, pos


def _codec(dtype: Any) -> tuple[Encoder, Decoder]:
    from pyspark.sql import types as T

    name = type(dtype).__name__
    if name in _INT_BITS:
        return _int_encoder(_INT_BITS[name], dtype.simpleString()), _unzigzag
    if isinstance(dtype, T.DoubleType | T.FloatType):
        fmt, label = (_F64, "double") if isinstance(dtype, T.DoubleType) else (_F32, "float")
        return _float_encoder(fmt, label), _float_decoder(fmt)
    if isinstance(dtype, T.BooleanType):
        return _enc_bool, _dec_bool
    if isinstance(dtype, T.StringType | T.CharType | T.VarcharType):
        return _enc_str, _dec_str
    if isinstance(dtype, T.BinaryType):
        return _enc_bin, _dec_bin
    if isinstance(dtype, T.DateType):
        return _enc_date, _dec_date
    if isinstance(dtype, T.TimestampType):
        return _micros_codec(dtype, "timestamp")
    if isinstance(dtype, T.TimestampNTZType):
        return _micros_codec(dtype, "timestamp_ntz")
    if isinstance(dtype, T.DecimalType):
        return _decimal_codec(dtype.precision, dtype.scale)
    if isinstance(dtype, T.ArrayType):
        return _array_codec(dtype)
    if isinstance(dtype, T.MapType):
        return _map_codec(dtype)
    if isinstance(dtype, T.StructType):
        return _struct_codec(dtype)
    if isinstance(dtype, T.NullType):
        return _enc_void, _dec_void
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
