"""Raw protobuf encoding and one-line descriptions of the requests the fuzzer sends.

The key-group parts of ``Append`` and ``PersistDurably`` are encoded by hand
(:func:`encode_parts`) so that one small message can be repeated thousands of
times without building a huge message object. Pure functions, safe from any
thread.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from dstl_client.core._pb import dstl_pb2 as pb
from loadtest.wire_fuzz.settings import DESC_LIMIT, U64


# ----------------------------------------------------------------- describing
def _nice_int(v: int) -> str:
    if v >= 1 << 16:
        for k in range(16, 65):
            if v == 1 << k:
                return f"{v} (2^{k})"
            if v == (1 << k) - 1:
                return f"{v} (2^{k}-1)"
    return str(v)


def _short(v: Any) -> str:
    if isinstance(v, Message):
        return describe(v)
    if isinstance(v, str | bytes):
        return f"{v[:40]!r}..(len {len(v)})" if len(v) > 48 else repr(v)
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return _nice_int(v)
    return repr(v)


def describe(msg: Message) -> str:
    """One line naming every set field; long strings, bytes and lists shortened."""
    parts: list[str] = []
    for fd, value in msg.ListFields():
        if fd.is_repeated:
            items = list(value)
            shown = ", ".join(_short(x) for x in items[:3])
            more = ", ..." if len(items) > 3 else ""
            parts.append(f"{fd.name}=[{shown}{more}] (n={len(items)})")
        else:
            parts.append(f"{fd.name}={_short(value)}")
    return f"{type(msg).__name__}({', '.join(parts)})"


def clip(text: str, limit: int = DESC_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    return text if len(text) <= limit else text[: limit - 20] + f"...(+{len(text) - limit + 20})"


# ----------------------------------------------------------------- raw encoding
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(field_no: int, wire_type: int) -> bytes:
    return varint(field_no << 3 | wire_type)


def c64(v: int) -> int:
    """Clamp to what a uint64 field holds."""
    return min(v, U64)


def sizes(*lengths: int) -> bytes:
    """The ``sizes`` field of a ``KeyGroupChanges``: little-endian uint32 lengths."""
    return struct.pack(f"<{len(lengths)}I", *lengths)


@dataclass(frozen=True, slots=True)
class Part:
    """One ``KeyGroupChanges`` message, sent ``times`` times in a row.

    Frozen (the message is not changed once in a part); built and encoded by
    one worker thread.
    """

    msg: pb.KeyGroupChanges
    times: int = 1


def encode_parts(field_no: int, parts: Sequence[Part]) -> bytes:
    """``parts`` as repeated field ``field_no`` (to append to an encoded request head)."""
    out: list[bytes] = []
    for p in parts:
        e = p.msg.SerializeToString()
        out.append((tag(field_no, 2) + varint(len(e)) + e) * p.times)
    return b"".join(out)


def describe_parts(parts: Sequence[Part]) -> str:
    shown = ", ".join((f"{p.times} x " if p.times > 1 else "") + describe(p.msg) for p in parts[:4])
    more = ", ..." if len(parts) > 4 else ""
    return f"changes=[{shown}{more}] (n={sum(p.times for p in parts)})"
