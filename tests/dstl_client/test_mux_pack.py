"""How the client packs queued writer requests into Mux messages (dstl_client._mux_leg.pack).

What is queued at the moment leaves in one message, which decodes as the
requests in order; a message stays within the byte, request and key-group
part bounds the sidecar checks, a request that does not fit leads the next
message, and ``None`` (half-close) ends the stream after what came before it.
"""

from __future__ import annotations

import queue

from dstl_client._mux_leg import COALESCE_BYTES, pack
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.format import MAX_CALLS_PER_MESSAGE, MAX_PARTS_PER_REQUEST


def persist(rid: int, parts: int = 0, payload: bytes = b"") -> pb.SessionRequest:
    req = pb.SessionRequest(id=rid)
    req.persist.log_id = f"log-{rid}"
    for _ in range(parts):
        req.persist.changes.add(key_group=0, count=1, sizes=b"\x00\x00\x00\x00", payload=payload)
    return req


def queued(*items: pb.SessionRequest | None) -> queue.SimpleQueue[pb.SessionRequest | None]:
    q: queue.SimpleQueue[pb.SessionRequest | None] = queue.SimpleQueue()
    for item in items:
        q.put(item)
    return q


def test_what_is_queued_leaves_in_one_message_in_order() -> None:
    q = queued(persist(2), persist(3))
    message, carry, count, end = pack(persist(1), q, 1 << 20)
    assert (carry, count, end) == (None, 3, False)
    assert [c.id for c in pb.MuxRequest.FromString(message).calls] == [1, 2, 3]
    assert pb.MuxRequest.FromString(message).calls[1].persist.log_id == "log-2"


def test_a_request_past_the_byte_bound_leads_the_next_message() -> None:
    big = persist(2, parts=1, payload=b"x" * 1000)
    q = queued(big, persist(3))
    message, carry, count, end = pack(persist(1), q, 600)
    assert count == 1 and carry is big and not end
    assert [c.id for c in pb.MuxRequest.FromString(message).calls] == [1]
    # alone, a request goes whatever its size (the writer kept it within the message limit)
    message, carry, count, _ = pack(big, q, 600)
    assert count == 1 and carry is not None and carry.id == 3


def test_requests_and_parts_per_message_are_bounded() -> None:
    q = queued(*(persist(i) for i in range(2, MAX_CALLS_PER_MESSAGE + 10)))
    _, carry, count, _ = pack(persist(1), q, 1 << 30)
    assert count == MAX_CALLS_PER_MESSAGE and carry is not None
    half = MAX_PARTS_PER_REQUEST // 2 + 1
    q = queued(persist(2, parts=half))
    _, carry, count, _ = pack(persist(1, parts=half), q, 1 << 30)
    assert count == 1 and carry is not None and carry.id == 2


def test_a_half_close_ends_after_the_requests_before_it() -> None:
    q = queued(persist(2), None, persist(3))
    message, carry, count, end = pack(persist(1), q, 1 << 20)
    assert (carry, count, end) == (None, 2, True)
    assert [c.id for c in pb.MuxRequest.FromString(message).calls] == [1, 2]


def test_large_requests_of_several_writers_leave_one_message_each() -> None:
    """Two appends that each fit the sidecar's message limit never share a message (the
    client does not know that limit: together they could pass it)."""
    half = persist(1, parts=1, payload=b"x" * (COALESCE_BYTES // 2 + 1))
    other = persist(2, parts=1, payload=b"y" * (COALESCE_BYTES // 2 + 1))
    message, carry, count, _ = pack(half, queued(other), 64 << 20)
    assert count == 1 and carry is other
    assert len(message) < COALESCE_BYTES
