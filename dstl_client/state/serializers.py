"""Serializers: how state values (and map keys) become bytes and back.

State is stored and logged as bytes, so every state names a serializer.
The built-in ones are stable across processes and Python versions (the bytes
go into checkpoints that a later run restores); :class:`PickleSerializer`
is offered for convenience but ties a checkpoint to compatible code.
"""

from __future__ import annotations

import json
import pickle
import struct
from typing import Any, Generic, Protocol, TypeVar

from dstl_client.core.errors import InvalidArgument

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Serializer(Protocol[T]):
    """Turns values of one type into bytes and back (``loads(dumps(v)) == v``)."""

    def dumps(self, value: T) -> bytes:
        """Encode ``value``."""
        ...

    def loads(self, data: bytes) -> T:
        """Decode what :meth:`dumps` produced."""
        ...


_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


class Int64Serializer:
    """Signed 64-bit integers, 8 bytes little-endian."""

    def dumps(self, value: int) -> bytes:
        try:
            return _I64.pack(value)
        except struct.error as exc:
            raise InvalidArgument(f"{value!r} is not a 64-bit integer: {exc}") from None

    def loads(self, data: bytes) -> int:
        return int(_I64.unpack(data)[0])


class Float64Serializer:
    """IEEE-754 doubles, 8 bytes little-endian."""

    def dumps(self, value: float) -> bytes:
        return _F64.pack(value)

    def loads(self, data: bytes) -> float:
        return float(_F64.unpack(data)[0])


class BoolSerializer:
    """``True``/``False`` as one byte."""

    def dumps(self, value: bool) -> bytes:
        return b"\x01" if value else b"\x00"

    def loads(self, data: bytes) -> bool:
        return data != b"\x00"


class StrSerializer:
    """Text as UTF-8."""

    def dumps(self, value: str) -> bytes:
        return value.encode("utf-8")

    def loads(self, data: bytes) -> str:
        return data.decode("utf-8")


class BytesSerializer:
    """Bytes as they are."""

    def dumps(self, value: bytes) -> bytes:
        return bytes(value)

    def loads(self, data: bytes) -> bytes:
        return bytes(data)


class JsonSerializer:
    """Any JSON value (compact, keys sorted, so equal values give equal bytes)."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class PickleSerializer:
    """Any picklable value (protocol 5). Restoring needs compatible classes."""

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=5)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class TupleSerializer(Generic[T]):
    """A fixed-length tuple, each field with its own serializer.

    Fields are length-prefixed (unsigned varint), so any serializer nests.
    """

    def __init__(self, *fields: Serializer[Any]) -> None:
        if not fields:
            raise InvalidArgument("TupleSerializer needs at least one field")
        self.fields = fields

    def dumps(self, value: tuple[Any, ...]) -> bytes:
        if len(value) != len(self.fields):
            raise InvalidArgument(f"expected a tuple of {len(self.fields)}, got {len(value)}")
        out = bytearray()
        for ser, item in zip(self.fields, value, strict=True):
            data = ser.dumps(item)
            out += encode_varint(len(data))
            out += data
        return bytes(out)

    def loads(self, data: bytes) -> tuple[Any, ...]:
        items = []
        pos = 0
        for ser in self.fields:
            n, pos = decode_varint(data, pos)
            items.append(ser.loads(data[pos : pos + n]))
            pos += n
        if pos != len(data):
            raise InvalidArgument("trailing bytes after a tuple")
        return tuple(items)


def encode_varint(n: int) -> bytes:
    """Unsigned LEB128."""
    if n < 0:
        raise InvalidArgument(f"varint of a negative number {n}")
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """``(value, next position)``; raises :class:`InvalidArgument` on truncation."""
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise InvalidArgument("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise InvalidArgument("varint too long")


INT64 = Int64Serializer()
FLOAT64 = Float64Serializer()
BOOL = BoolSerializer()
STR = StrSerializer()
BYTES = BytesSerializer()
JSON = JsonSerializer()
PICKLE = PickleSerializer()
