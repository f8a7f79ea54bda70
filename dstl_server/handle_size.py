"""Whether a persist's handle can travel back in one response message.

A handle is durable once its uploads are done, but one that spans more
sections than a message may carry cannot be answered: the caller gets
:class:`SqnOutOfRange` saying why (truncate the log, or persist from a later
SQN) instead of a bare RESOURCE_EXHAUSTED from the transport. The registry
checks every handle it answers, unary or on a stream, with this one function.
"""

from __future__ import annotations

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import SqnOutOfRange
from dstl_client.core.handle import ChangelogHandle

#: room left in a response message for everything but sizes and payload
RESPONSE_MARGIN_BYTES = 32 << 10
#: upper bounds of an encoded PersistResponse beyond its strings (framing, every number
#: at its widest) and per entry; a string adds at most 4 bytes per character (UTF-8)
_HANDLE_FIXED_BOUND = 128
_ENTRY_FIXED_BOUND = 72


def check_travels(handle: ChangelogHandle, max_bytes: int) -> None:
    """Refuse ``handle`` if its encoded answer exceeds ``max_bytes``; the exact size is
    computed only when a cheap upper bound says it may not fit."""
    bound = _HANDLE_FIXED_BOUND + 4 * (len(handle.job_id) + len(handle.log_id))
    for e in handle.entries:
        bound += 4 * len(e.object_key) + _ENTRY_FIXED_BOUND
    if bound <= max_bytes:
        return
    size = pb.PersistResponse(handle=handle.to_proto()).ByteSize()
    if size > max_bytes:
        raise SqnOutOfRange(
            f"the handle from SQN {handle.from_sqn} spans {len(handle.entries)} sections, "
            f"{size} bytes encoded, more than a message may carry ({max_bytes}); "
            "truncate the log or persist from a later SQN"
        )
