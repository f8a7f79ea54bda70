"""Encoding of state keys and of the changes logged to the DSTL.

A state row is addressed by ``(key_group, k)`` where ``k`` is

    k      := prefix suffix
    prefix := varint(len(name)) name varint(len(key)) key

``name`` is the state's name (UTF-8), ``key`` the current key's bytes and
``suffix`` empty for value, list and reducing states; a :class:`MapState`
entry's suffix is ``0x00`` followed by the serialized map key, so a map's
entries are the contiguous range of ``k`` starting with ``prefix 0x00`` (the
*map prefix*), and a replay tells map entries from other rows.

A change (one DSTL record) is

    PUT          0x01 varint(len(k)) k value
    DELETE       0x02 k
    DELETE_PREFIX 0x03 prefix          (a whole map)
    LIST_APPEND  0x04 varint(len(k)) k elements   (elements as in a list value)

A list value is its elements back to back, each ``varint(len) bytes``, so an
append is a byte concatenation. Snapshots (materialized state) are PUT records
too, so one decoder serves the changelog and the snapshots.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import chain
from operator import add, itemgetter

from dstl_client.core.errors import CorruptObject, InvalidArgument
from dstl_client.state.serializers import decode_varint, encode_varint

OP_PUT = 1
OP_DELETE = 2
OP_DELETE_PREFIX = 3
OP_LIST_APPEND = 4

_OP_BYTES = {op: bytes((op,)) for op in (OP_PUT, OP_DELETE, OP_DELETE_PREFIX, OP_LIST_APPEND)}


def state_prefix(name_bytes: bytes, key: bytes) -> bytes:
    """The prefix of every row of one state for one key."""
    return encode_varint(len(name_bytes)) + name_bytes + encode_varint(len(key)) + key


MAP_TAG = b"\x00"


def map_prefix(name_bytes: bytes, key: bytes) -> bytes:
    """The prefix of every entry of one map state for one key."""
    return state_prefix(name_bytes, key) + MAP_TAG


def map_prefix_of(k: bytes) -> bytes | None:
    """The map prefix of a map entry's row key; ``None`` for other rows."""
    try:
        n, pos = decode_varint(k, 0)
        m, pos = decode_varint(k, pos + n)
    except InvalidArgument as exc:
        raise CorruptObject(f"bad state row key: {exc}") from None
    end = pos + m
    if end >= len(k):
        return None
    return k[: end + 1]


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``prefix``."""
    b = bytearray(prefix)
    while b:
        if b[-1] != 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


def encode_put(k: bytes, value: bytes) -> bytes:
    return b"\x01" + encode_varint(len(k)) + k + value


#: the first two bytes of a PUT of a row key shorter than 128 bytes, by key length
_PUT_HEADS = tuple(b"\x01" + bytes((n,)) for n in range(0x80))
_first = itemgetter(0)
_second = itemgetter(1)


def pack_puts(rows: Sequence[tuple[bytes, bytes]]) -> tuple[array[int], bytes]:
    """The PUTs of ``rows`` (``(k, value)``) packed: ``(sizes, payload)``.

    ``payload`` is ``encode_put(k, value)`` of every row back to back and
    ``sizes`` (``array("I")``) their lengths, in order: what
    :meth:`~dstl_client.writer.ChangelogWriter.append_packed` takes. Rows whose
    keys are all shorter than 128 bytes (the usual case) are encoded in
    C-level passes, with no Python call per row.
    """
    if not rows:
        return array("I"), b""
    ks = list(map(_first, rows))
    klens = list(map(len, ks))
    if max(klens) >= 0x80:
        changes = [encode_put(k, v) for k, v in rows]
        return array("I", map(len, changes)), b"".join(changes)
    vs = list(map(_second, rows))
    payload = b"".join(
        chain.from_iterable(zip(map(_PUT_HEADS.__getitem__, klens), ks, vs, strict=True))
    )
    sizes = array("I", map(add, map(len, vs), map((2).__add__, klens)))
    return sizes, payload


def encode_delete(k: bytes) -> bytes:
    return b"\x02" + k


def encode_delete_prefix(prefix: bytes) -> bytes:
    return b"\x03" + prefix


def encode_list_append(k: bytes, elements: bytes) -> bytes:
    return b"\x04" + encode_varint(len(k)) + k + elements


def decode_change(data: bytes) -> tuple[int, bytes, bytes]:
    """``(op, k_or_prefix, value_or_elements)``; raises :class:`CorruptObject`."""
    if not data:
        raise CorruptObject("empty state change")
    op = data[0]
    try:
        if op in (OP_PUT, OP_LIST_APPEND):
            n, pos = decode_varint(data, 1)
            if pos + n > len(data):
                raise CorruptObject("state change key runs past its end")
            return op, data[pos : pos + n], data[pos + n :]
    except InvalidArgument as exc:
        raise CorruptObject(f"bad state change: {exc}") from None
    if op in (OP_DELETE, OP_DELETE_PREFIX):
        return op, data[1:], b""
    raise CorruptObject(f"unknown state change op {op}")


def encode_element(data: bytes) -> bytes:
    """One list element as stored in a list value."""
    return encode_varint(len(data)) + data


def iter_elements(value: bytes) -> Iterator[bytes]:
    """The elements of a list value."""
    pos = 0
    end = len(value)
    while pos < end:
        n, pos = decode_varint(value, pos)
        if pos + n > end:
            raise CorruptObject("list element runs past the value's end")
        yield value[pos : pos + n]
        pos += n


def decode_state_key(k: bytes) -> tuple[str, bytes, bytes]:
    """``(state name, key bytes, suffix)`` of a row key (suffix: ``0x00`` + map key, or empty)."""
    try:
        n, pos = decode_varint(k, 0)
        name = k[pos : pos + n].decode("utf-8")
        pos += n
        m, pos = decode_varint(k, pos)
    except (InvalidArgument, UnicodeDecodeError) as exc:
        raise CorruptObject(f"bad state row key: {exc}") from None
    if pos + m > len(k):
        raise CorruptObject("state row key runs past its end")
    return name, k[pos : pos + m], k[pos + m :]
