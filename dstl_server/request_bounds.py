"""Per-method request bounds, checked on the wire bytes before a request is decoded.

Decoding a protobuf message builds every element of its repeated fields: an
empty ``HandleEntry``, ``KeyGroupChanges``, object key or forwarded section
costs 2 bytes on the wire and some 60 bytes once decoded (then more as Python
objects), so a check of ``len(request.entries)`` after decoding comes too
late: 8 MB of empty handle entries took half a second and 276 MiB to decode.
This module bounds a request's work by what is on the wire, before anything
is built:

* **bytes per method** (:func:`method_limits`): calls that carry changes
  (``Append``, ``PersistDurably``, ``Session`` and ``Mux`` messages, ``Forward``) up to
  ``max_request_bytes``; ``ReadChanges`` (a handle) up to
  ``max_read_request_bytes``; every other call up to
  ``max_control_request_bytes`` (each capped at ``max_request_bytes``,
  gRPC's own bound for every message). More: :class:`RequestTooLarge`.
* **items per repeated field** (:data:`SHAPES`): a scan of the wire format
  counts the elements of each bounded repeated field (summed over every
  occurrence of a message field, which protobuf merges) and refuses the
  request as soon as one passes its limit; the scan visits at most the sum of
  the limits plus :data:`_SCALAR_FIELD_ALLOWANCE` fields in all, so its own
  cost is bounded by the limits and not by the request. Bytes that are not
  protobuf wire format are refused like the decoder refuses them.

Pure functions over bytes: any thread (gRPC calls the deserializer that uses
them on the server's event loop).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from dstl_client.core.errors import (
    DstlError,
    InvalidArgument,
    InvalidHandle,
    RequestTooLarge,
)
from dstl_client.core.format import MAX_CALLS_PER_MESSAGE, MAX_PARTS_PER_REQUEST
from dstl_client.core.handle import MAX_ENTRIES

#: most object keys one DiscardObjects call names
MAX_DISCARD_KEYS = 10_000
#: most key groups one ReadChanges call names (twice the largest max parallelism)
MAX_READ_KEY_GROUPS = 1 << 16
#: most log sections one Forward call carries (a child never sends more)
MAX_FORWARD_SECTIONS = 1 << 14
#: fields a scanned request may hold beyond the elements of its bounded lists
#: (every singular field once, with room for a repeated one)
_SCALAR_FIELD_ALLOWANCE = 1024

#: methods whose requests carry changes or sections: up to max_request_bytes
DATA_METHODS = frozenset({"Append", "PersistDurably", "Session", "Mux", "Forward"})
#: the method whose request carries a handle: up to max_read_request_bytes
READ_METHOD = "ReadChanges"


@dataclass(frozen=True, slots=True)
class Counted:
    """A bounded repeated field: at most ``limit`` elements, else ``error``.

    ``packed``: a repeated scalar whose occurrences may be packed (a
    length-delimited run of varints, each one element). ``width``: a bytes
    field of fixed-width elements (``dstl.v1.PackedParts.key_groups``: one
    u32 per part), each occurrence ``length // width`` elements. ``tally``:
    the name its elements are counted under, shared by the fields that hold
    the same thing in two forms (a call's parts, repeated or packed); empty:
    its own count.
    """

    what: str
    limit: int
    error: type[DstlError] = InvalidArgument
    packed: bool = False
    width: int = 0
    tally: str = ""


@dataclass(frozen=True, slots=True)
class Shape:
    """What the scan checks in one message type: its bounded lists and the messages inside
    it that hold bounded lists (scanned too). Other fields are skipped unread."""

    name: str
    counted: Mapping[int, Counted] = field(default_factory=dict)
    nested: Mapping[int, Shape] = field(default_factory=dict)

    def visit_limit(self) -> int:
        """Fields the scan of one request may visit at most."""
        own = sum(c.limit for c in self.counted.values())
        return own + sum(s.visit_limit() for s in self.nested.values()) + _SCALAR_FIELD_ALLOWANCE


def _parts(field_no: int, packed_no: int, name: str) -> Shape:
    """A call's parts: repeated (``field_no``) and packed (``packed_no``) count together."""
    what = "key-group parts in one request"
    tally = f"{name} parts"
    counted = Counted(what, MAX_PARTS_PER_REQUEST, InvalidArgument, tally=tally)
    packed = Counted(what, MAX_PARTS_PER_REQUEST, InvalidArgument, width=4, tally=tally)
    return Shape(
        name,
        counted={field_no: counted},
        nested={packed_no: Shape("PackedParts", counted={1: packed})},
    )


_APPEND = _parts(2, 3, "AppendRequest")
_PERSIST = _parts(3, 4, "PersistRequest")
_SESSION = Shape("SessionRequest", nested={2: _APPEND, 4: _PERSIST})
_HANDLE = Shape("Handle", counted={8: Counted("handle entries", MAX_ENTRIES, InvalidHandle)})

#: the request of each method with bounded lists (field numbers of proto/dstl/v1)
SHAPES: Mapping[str, Shape] = {
    "Append": _APPEND,
    "PersistDurably": _PERSIST,
    "Session": _SESSION,
    # the parts of every call of a message count together (one Counted per call kind)
    "Mux": Shape(
        "MuxRequest",
        counted={1: Counted("writer requests in one message", MAX_CALLS_PER_MESSAGE)},
        nested={1: _SESSION},
    ),
    "ReadChanges": Shape(
        "ReadChangesRequest",
        counted={2: Counted("key groups", MAX_READ_KEY_GROUPS, packed=True)},
        nested={1: _HANDLE},
    ),
    "DiscardObjects": Shape(
        "DiscardObjectsRequest", counted={2: Counted("object keys", MAX_DISCARD_KEYS)}
    ),
    "Forward": Shape("ForwardRequest", counted={2: Counted("sections", MAX_FORWARD_SECTIONS)}),
}


def method_limits(
    methods: list[str], *, max_request: int, max_read: int, max_control: int
) -> dict[str, int]:
    """Most bytes a request of each of ``methods`` may hold (see the module docstring)."""
    out: dict[str, int] = {}
    for m in methods:
        if m in DATA_METHODS:
            out[m] = max_request
        elif m == READ_METHOD:
            out[m] = min(max_read, max_request)
        else:
            out[m] = min(max_control, max_request)
    return out


def _unscanned_bytes(shape: Shape) -> int:
    """Requests of at most this many bytes cannot break a bound of ``shape``: a field
    takes 2 bytes or more, an element of a packed list 1 or more."""
    bound = 2 * shape.visit_limit()
    for c in shape.counted.values():
        bound = min(bound, c.limit if c.packed else c.width * c.limit or 2 * c.limit)
    for inner in shape.nested.values():
        bound = min(bound, _unscanned_bytes(inner))
    return bound


_VISITS = {m: s.visit_limit() for m, s in SHAPES.items()}
_UNSCANNED_BYTES = {m: _unscanned_bytes(s) for m, s in SHAPES.items()}


class _Undecodable(Exception):
    """The bytes are not protobuf wire format (the scan's internal signal)."""


class _Scan:
    """One scan of one request: the running counts and the fields visited."""

    __slots__ = ("counts", "left", "method")

    def __init__(self, method: str, visits: int) -> None:
        self.method = method
        self.counts: dict[int | str, int] = {}
        self.left = visits

    def walk(self, data: bytes, start: int, end: int, shape: Shape) -> None:
        counted = shape.counted
        nested = shape.nested
        counts = self.counts
        left = self.left  # kept in a local (an append's parts: a few steps each)
        pos = start
        while pos < end:
            left -= 1
            if left < 0:
                raise InvalidArgument(
                    f"{self.method} request holds too many fields (a {shape.name} of the "
                    "client library never does)"
                )
            key = data[pos]  # a one-byte tag (fields 1-15) is read inline
            pos += 1
            if key >= 0x80:
                key, pos = _varint(data, pos - 1, end)
            field_no, wire = key >> 3, key & 7
            if field_no == 0:
                raise _Undecodable("field number 0")
            if wire == 2:
                if pos < end and data[pos] < 0x80:  # lengths below 16384 are read inline
                    length = data[pos]
                    pos += 1
                elif pos + 1 < end and data[pos + 1] < 0x80:
                    length = data[pos] & 0x7F | data[pos + 1] << 7
                    pos += 2
                else:
                    length, pos = _varint(data, pos, end)
                stop = pos + length
                if stop > end:
                    raise _Undecodable("a length runs past the end of the message")
                count = counted.get(field_no)
                if count is not None:
                    n = 1
                    if count.packed:  # one element per byte that ends a varint
                        chunk = data[pos:stop]
                        n = length - len(chunk.translate(None, _VARINT_ENDS))
                    elif count.width:
                        n = length // count.width
                    tally = count.tally or id(count)
                    total = counts.get(tally, 0) + n
                    if total > count.limit:
                        self._add(count, n)  # raises
                    counts[tally] = total
                inner = nested.get(field_no)  # a counted message may hold bounded lists too
                if inner is not None:
                    self.left = left
                    self.walk(data, pos, stop, inner)
                    left = self.left
                pos = stop
            elif wire == 0:
                _, pos = _varint(data, pos, end)
                count = counted.get(field_no)
                if count is not None:
                    self._add(count, 1)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise _Undecodable(f"wire type {wire}")
            if pos > end:
                raise _Undecodable("a field runs past the end of the message")
        self.left = left

    def _add(self, count: Counted, n: int) -> None:
        key = count.tally or id(count)
        total = self.counts.get(key, 0) + n
        if total > count.limit:
            raise count.error(
                f"{self.method}: more than {count.limit} {count.what} (at most {count.limit}; "
                "refused before decoding)"
            )
        self.counts[key] = total


#: bytes that end a varint (high bit clear): deleted, the rest are continuation bytes
_VARINT_ENDS = bytes(range(0x80))


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Undecodable("truncated or overlong varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def check_request(method: str, data: bytes, limit: int) -> None:
    """Refuse ``data`` as a ``method`` request before decoding it, if it is out of bounds.

    Raises :class:`RequestTooLarge` past ``limit`` bytes, the count's error
    past an item limit (:data:`SHAPES`), :class:`InvalidArgument` for bytes
    that are not protobuf wire format. A method without a shape has no
    bounded list: only its size is checked.
    """
    if len(data) > limit:
        raise RequestTooLarge(
            f"a {method} request holds {len(data)} bytes; this sidecar accepts at most "
            f"{limit} for {method} (refused before decoding)"
        )
    shape = SHAPES.get(method)
    if shape is None or len(data) <= _UNSCANNED_BYTES[method]:
        return  # too short to hold more fields or elements than allowed
    scan = _Scan(method, _VISITS[method])
    try:
        scan.walk(data, 0, len(data), shape)
    except _Undecodable as exc:
        raise InvalidArgument(f"request bytes do not decode as {shape.name}: {exc}") from None


# ------------------------------------------------------------ writer call headers
#: field numbers of the changes (repeated, packed) of AppendRequest / PersistRequest,
#: and of the SessionRequest calls that carry them (append, persist)
_CHANGES_FIELD = {"Append": (2, 3), "PersistDurably": (3, 4)}
_SESSION_CALLS_WITH_CHANGES = {2: (2, 3), 4: (3, 4)}
_SESSION_ID_FIELD = 1
_LOG_ID_FIELD = 1
_SESSION_FIELD = 14
_SEQ_FIELD = 15


@dataclass(frozen=True, slots=True)
class CallHeader:
    """What a writer call says about itself, read off the wire without its changes.

    ``log_id``, ``session`` and ``seq`` of a unary ``Append`` or
    ``PersistDurably`` (or of the call inside a ``Session`` request, whose
    own id is ``request_id``); ``changes``: whether it holds a key-group part.
    """

    log_id: str
    changes: bool
    session: int = 0
    seq: int = 0
    request_id: int = 0


def call_header(method: str, data: bytes) -> CallHeader | None:
    """The header of a writer call that may carry changes, or None (another method, or
    bytes that do not scan: the decoder then says what is wrong).

    Reads the top-level fields (and those of a ``Session`` request's call)
    and skips every length-delimited field unread, so it costs one pass over
    the fields and copies nothing but the log id. For requests that
    :func:`check_request` accepted.
    """
    try:
        if method in _CHANGES_FIELD:
            return _writer_call(data, 0, len(data), _CHANGES_FIELD[method])
        if method != "Session":
            return None
        request_id = 0
        log_id = ""
        changes = False
        for field_no, start, value in _fields(data, 0, len(data)):
            if field_no == _SESSION_ID_FIELD and start < 0:
                request_id = value
            elif start >= 0 and field_no in _SESSION_CALLS_WITH_CHANGES:
                inner = _writer_call(data, start, value, _SESSION_CALLS_WITH_CHANGES[field_no])
                changes = changes or inner.changes  # occurrences merge: any part counts
                log_id = inner.log_id or log_id
        return CallHeader(log_id, changes, request_id=request_id)
    except (_Undecodable, UnicodeDecodeError):
        return None


def _writer_call(data: bytes, start: int, end: int, changes_fields: tuple[int, int]) -> CallHeader:
    log_id = ""
    session = seq = 0
    changes = False
    for field_no, pos, value in _fields(data, start, end):
        if pos >= 0:
            if field_no in changes_fields:
                changes = True
            elif field_no == _LOG_ID_FIELD:
                log_id = data[pos:value].decode()
        elif field_no == _SESSION_FIELD:
            session = value
        elif field_no == _SEQ_FIELD:
            seq = value
    return CallHeader(log_id, changes, session, seq)


def _fields(data: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int]]:
    """``(field, -1, value)`` per varint field, ``(field, start, stop)`` per length-delimited
    one (its bytes are ``data[start:stop]``); fixed-width fields are skipped."""
    while pos < end:
        key, pos = _varint(data, pos, end)
        field_no, wire = key >> 3, key & 7
        if field_no == 0:
            raise _Undecodable("field number 0")
        if wire == 0:
            value, pos = _varint(data, pos, end)
            yield field_no, -1, value
        elif wire == 2:
            length, pos = _varint(data, pos, end)
            stop = pos + length
            if stop > end:
                raise _Undecodable("a length runs past the end of the message")
            yield field_no, pos, stop
            pos = stop
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise _Undecodable(f"wire type {wire}")
        if pos > end:
            raise _Undecodable("a field runs past the end of the message")
