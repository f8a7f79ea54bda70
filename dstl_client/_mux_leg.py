"""One gRPC ``Mux`` call of a client's writer stream, and how its messages are packed.

:class:`MuxLeg` holds the call, the requests sent on it and not yet
answered, and the queue gRPC's sending thread takes them from. That thread
packs every request queued at the moment it looks into one ``MuxRequest``
(:func:`pack`): the persists a round's writers make together leave in one
message. A message stays within :data:`~dstl_client.core.format.MAX_CALLS_PER_MESSAGE`
requests and :data:`~dstl_client.core.format.MAX_PARTS_PER_REQUEST` key-group
parts (the sidecar's bounds) and carries either one request, as large as the
writer made it (within the connection's ``max_message_bytes``, as a unary
call), or several of at most :data:`COALESCE_BYTES` together: the client does
not know the sidecar's ``max_request_bytes``, and packing two writers' large
appends into one message could pass it where neither alone does. A request
that does not fit leads the next message.
"""

from __future__ import annotations

import concurrent.futures
import queue
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.format import MAX_CALLS_PER_MESSAGE, MAX_PARTS_PER_REQUEST

if TYPE_CHECKING:
    from dstl_client.transport import Connection

#: several requests share a message up to this many bytes (a round's persists are small;
#: large appends gain nothing from sharing one); one request alone may be larger
COALESCE_BYTES = 1 << 20
#: the tag of MuxRequest.calls (field 1, length-delimited)
_CALLS_TAG = b"\x0a"


@dataclass(slots=True, eq=False)
class MuxLane:
    """One writer's state on the client's stream: the resend of requests refused for a
    full budget (see :mod:`dstl_client._stream`). Changed under the stream's lock."""

    log_id: str
    #: requests waiting for a resend's pause to end (None: not resending)
    held: list[Entry] | None = None
    attempt: int = 0
    refused_since: float | None = None
    #: the sidecar refuses this writer's requests until one comes with ``resend``
    resend_next: bool = False


@dataclass(slots=True, eq=False)
class Entry:
    """A request, its writer and the future of its answer (the same across resends)."""

    request: pb.SessionRequest
    lane: MuxLane
    future: concurrent.futures.Future[pb.SessionResponse] = field(
        default_factory=concurrent.futures.Future
    )
    #: put on a leg's queue once (a resend sends a copy: the queue may still hold it)
    queued: bool = False


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _parts(request: pb.SessionRequest) -> int:
    which = request.WhichOneof("call")
    if which == "append":
        call: pb.AppendRequest | pb.PersistRequest = request.append
    elif which == "persist":
        call = request.persist
    else:
        return 0
    return len(call.changes) + len(call.packed.key_groups) // 4


class MuxLeg:
    """One gRPC ``Mux`` call. ``pending`` (id -> entry, in the order sent), ``moved``
    (ids sent again later, or given up: their answers here are expected and dropped) and
    ``last_received`` (``time.monotonic()`` of its last answer message) change under
    the stream's lock; ``requests`` is gRPC's sending thread's queue (``None``
    half-closes)."""

    def __init__(self, conn: Connection) -> None:
        self.requests: queue.SimpleQueue[pb.SessionRequest | None] = queue.SimpleQueue()
        self.pending: dict[int, Entry] = {}
        self.moved: set[int] = set()
        self.last_received = 0.0
        self._max_bytes = conn.max_message_bytes
        #: messages and requests sent (gRPC's sending thread counts them)
        self.messages_sent = 0
        self.requests_sent = 0
        self.call: Any = conn.open_mux(self._outgoing())

    def _outgoing(self) -> Iterator[bytes]:
        """The encoded ``MuxRequest`` messages, as gRPC's sending thread takes them."""
        requests = self.requests
        carry: pb.SessionRequest | None = None
        while True:
            first = carry if carry is not None else requests.get()
            if first is None:
                return
            message, carry, count, end = pack(first, requests, self._max_bytes)
            self.messages_sent += 1
            self.requests_sent += count
            yield message
            if end:
                return


def pack(
    first: pb.SessionRequest,
    requests: queue.SimpleQueue[pb.SessionRequest | None],
    max_bytes: int,
) -> tuple[bytes, pb.SessionRequest | None, int, bool]:
    """One ``MuxRequest``: ``first`` and what ``requests`` holds now, within the bounds.

    Returns the message, the request left for the next one (None), how many
    it carries and whether the queue said to half-close.
    """
    frames: list[bytes] = []
    size = parts = count = 0
    shared_bytes = min(max_bytes, COALESCE_BYTES)
    request: pb.SessionRequest | None = first
    while request is not None:
        body = request.SerializeToString()
        frame_size = len(body) + 6
        n = _parts(request)
        if count and (
            size + frame_size > shared_bytes
            or parts + n > MAX_PARTS_PER_REQUEST
            or count >= MAX_CALLS_PER_MESSAGE
        ):
            return b"".join(frames), request, count, False
        frames += (_CALLS_TAG, _varint(len(body)), body)
        size += frame_size
        parts += n
        count += 1
        try:
            request = requests.get_nowait()
        except queue.Empty:
            return b"".join(frames), None, count, False
    return b"".join(frames), None, count, True
