"""Where a processor's timers and TTL index live in the keyed state, and how times are encoded.

Everything a processor keeps is a state row of its key group (see
:mod:`dstl_client.state.changes`), written through the task's backend, so it
is logged to the DSTL, checkpointed, restored and rescaled like any state.
Three reserved state names (user names starting with ``$`` are refused, as
in Spark, so they cannot collide):

``$timers``       a map per key: ``ms`` → ``b""`` (the key's timers, for ``listTimers``)
``$timer-index``  a map per *key group* (key bytes empty): ``ms key`` → ``b""``
``$ttl-index``    a map per key group: ``ms name key user-key`` → ``b""``

The per-key-group maps are sorted by time: the expired entries of a key group
are one range scan from its start, whatever else the key group holds. A time
is 8 bytes, big-endian, with the sign bit flipped (byte order = time order).

Pure functions and constants: safe from any thread.
"""

from __future__ import annotations

import struct

from dstl_client.core.errors import InvalidArgument
from dstl_client.state.changes import map_prefix
from dstl_client.state.serializers import decode_varint, encode_varint

RESERVED_PREFIX = "$"
TIMERS = b"$timers"
TIMER_INDEX = b"$timer-index"
TTL_INDEX = b"$ttl-index"
#: the map prefixes of the per-key-group indexes (key bytes empty)
TIMER_INDEX_PREFIX = map_prefix(TIMER_INDEX, b"")
TTL_INDEX_PREFIX = map_prefix(TTL_INDEX, b"")

TIME_BYTES = 8
_U64 = struct.Struct(">Q")
_OFFSET = 1 << 63
MIN_MS = -(1 << 63)
MAX_MS = (1 << 63) - 1


def encode_ms(ms: int) -> bytes:
    """A signed 64-bit time as 8 bytes that sort like the times."""
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise InvalidArgument(f"a time in ms is an int, not {ms!r}")
    if not MIN_MS <= ms <= MAX_MS:
        raise InvalidArgument(f"time {ms} is out of range")
    return _U64.pack(ms + _OFFSET)


def decode_ms(data: bytes, pos: int = 0) -> int:
    if pos + TIME_BYTES > len(data):
        raise InvalidArgument("truncated time")
    return int(_U64.unpack_from(data, pos)[0]) - _OFFSET


def index_bound(prefix: bytes, up_to_ms: int) -> bytes | None:
    """Exclusive end of the index entries at or before ``up_to_ms`` (``None``: all of them)."""
    if up_to_ms >= MAX_MS:
        return None
    return prefix + encode_ms(up_to_ms + 1)


def check_state_name(name: str) -> None:
    """A user state name: non-empty text, not starting with the reserved ``$``."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a state name is a non-empty string, not {name!r}")
    if name.startswith(RESERVED_PREFIX):
        raise InvalidArgument(f"state name {name!r}: names starting with '$' are reserved")


def encode_ttl_entry(expiry_ms: int, name: bytes, key: bytes, user_key: bytes) -> bytes:
    """The suffix of a ``$ttl-index`` entry (after its prefix)."""
    return (
        encode_ms(expiry_ms)
        + encode_varint(len(name))
        + name
        + encode_varint(len(key))
        + key
        + user_key
    )


def decode_ttl_entry(suffix: bytes) -> tuple[int, bytes, bytes, bytes]:
    """``(expiry, state name, key bytes, user key bytes)`` of a ``$ttl-index`` entry's suffix."""
    expiry = decode_ms(suffix)
    n, pos = decode_varint(suffix, TIME_BYTES)
    name = suffix[pos : pos + n]
    pos += n
    m, pos = decode_varint(suffix, pos)
    if pos + m > len(suffix):
        raise InvalidArgument("truncated TTL index entry")
    return expiry, name, suffix[pos : pos + m], suffix[pos + m :]


def stamp(expiry_ms: int, data: bytes) -> bytes:
    """A value with its expiry in front (states with a TTL)."""
    return encode_ms(expiry_ms) + data


def unstamp(raw: bytes) -> tuple[int, bytes]:
    """``(expiry, value)`` of a stamped value."""
    return decode_ms(raw), raw[TIME_BYTES:]
