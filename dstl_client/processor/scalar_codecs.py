"""The encodings of a row's scalar fields: numbers, booleans, text, bytes, dates, times, decimals.

Part of the row encoding of :mod:`dstl_client.processor.codec` (the layout
table is there): :func:`scalar_codec` gives the encoder and decoder of one
Spark scalar type, or ``None`` for a struct, array or map. Each checks
what it is given and raises :class:`~dstl_client.core.errors.InvalidArgument`
naming the field's type rather than store a value its type does not hold.
Pure functions: any thread.
"""

from __future__ import annotations

import datetime
import decimal
import reprlib
import struct
from collections.abc import Callable
from typing import Any

from dstl_client.core.errors import InvalidArgument
from dstl_client.state.serializers import decode_varint, encode_varint

__all__ = ["Decoder", "Encoder", "plain", "scalar_codec", "shown"]

Encoder = Callable[[Any, bytearray], None]
Decoder = Callable[[bytes, int], tuple[Any, int]]

_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_EPOCH = datetime.date(1970, 1, 1).toordinal()
_INT_BITS = {"ByteType": 8, "ShortType": 16, "IntegerType": 32, "LongType": 64}


def plain(value: Any) -> Any:
    """NumPy / pandas scalars as Python values (duck-typed: no NumPy import).

    A NumPy array (``ndim`` at least 1, what pandas hands over for an array
    column) stays as it is: an array field takes it as a list
    (:mod:`dstl_client.processor.codec`), any other field refuses it.
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


def shown(value: Any) -> str:
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
        value = plain(value)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise InvalidArgument(f"{type_name} needs an integer, not {shown(value)}")
        if not low <= value <= high:
            raise InvalidArgument(f"{value} does not fit {type_name}")
        out += encode_varint((value << 1) ^ (value >> 63))

    return enc


def _float_encoder(fmt: struct.Struct, type_name: str) -> Encoder:
    def enc(value: Any, out: bytearray) -> None:
        value = plain(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidArgument(f"{type_name} needs a number, not {shown(value)}")
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
    value = plain(value)
    if not (isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))):
        raise InvalidArgument(f"boolean needs a bool, not {shown(value)}")
    out.append(1 if value else 0)


def _dec_bool(data: bytes, pos: int) -> tuple[Any, int]:
    if pos >= len(data):
        raise InvalidArgument("truncated value")
    return data[pos] != 0, pos + 1


def _enc_str(value: Any, out: bytearray) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"string needs a str, not {shown(value)}")
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
    value = plain(value)
    if isinstance(value, datetime.datetime):
        value = value.date()
    if not isinstance(value, datetime.date):
        raise InvalidArgument(f"date needs a datetime.date, not {shown(value)}")
    _zigzag(value.toordinal() - _EPOCH, out)


def _dec_date(data: bytes, pos: int) -> tuple[Any, int]:
    days, pos = _unzigzag(data, pos)
    return datetime.date.fromordinal(days + _EPOCH), pos


def _micros_codec(spark_type: Any, type_name: str) -> tuple[Encoder, Decoder]:
    """Timestamps as Spark's Python conversion gives them (``toInternal``/``fromInternal``)."""

    def enc(value: Any, out: bytearray) -> None:
        value = plain(value)
        if not isinstance(value, datetime.datetime):
            raise InvalidArgument(f"{type_name} needs a datetime, not {shown(value)}")
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
        value = plain(value)
        if isinstance(value, bool) or not isinstance(value, decimal.Decimal | int | float):
            raise InvalidArgument(f"decimal needs a Decimal, not {shown(value)}")
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


def _enc_void(value: Any, out: bytearray) -> None:
    raise InvalidArgument(f"void holds only None, not {value!r}")


def _dec_void(data: bytes, pos: int) -> tuple[Any, int]:
    return None, pos


def scalar_codec(dtype: Any) -> tuple[Encoder, Decoder] | None:
    """The codec of a scalar Spark type; ``None`` for a struct, array or map (and unknown types)."""
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
    if isinstance(dtype, T.NullType):
        return _enc_void, _dec_void
    return None
