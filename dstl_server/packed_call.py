"""A call's changes as one ``dstl.v1.PackedParts``: read once, checked and split in C loops.

A call sends its key-group parts either as repeated ``KeyGroupChanges``
(one protobuf message per key group, read field by field) or packed: four
byte strings for all its parts (key groups, counts, sizes, payload). The
sidecar's work per part was about 6 us of Python on the repeated form (the
wire scan, the checks, the copies of each field, the budget's count); the
packed form is read as four objects and its totals checked with ``array``
and C loops over all parts at once, so the sidecar's per-part cost is a
few C-level steps.

:class:`PackedCall` is what the server's writer path passes where it passed
a request's ``changes`` (see :data:`~dstl_server.parts.CallParts`): it has a
length (its parts), its bytes (:func:`~dstl_server.parts.charge_of` charges
them), and :meth:`PackedCall.arrays`: its key groups, counts and sizes,
from which :func:`~dstl_server.parts.check_call` keeps it packed or splits
it into ``(key group, PackedChanges)`` parts. Pure; any thread.
"""

from __future__ import annotations

import sys
from array import array
from typing import Protocol

from dstl_client.core.errors import InvalidArgument

_BIG_ENDIAN = sys.byteorder == "big"


class PackedMessage(Protocol):
    """The ``dstl.v1.PackedParts`` fields a :class:`PackedCall` reads."""

    @property
    def key_groups(self) -> bytes: ...

    @property
    def counts(self) -> bytes: ...

    @property
    def sizes(self) -> bytes: ...

    @property
    def payload(self) -> bytes: ...


def _u32s(data: bytes) -> array[int]:
    out = array("I")
    out.frombytes(data)
    if _BIG_ENDIAN:  # pragma: no cover - the wire is little-endian
        out.byteswap()
    return out


class PackedCall:
    """One call's parts in the packed form, each field read (copied) from the message once.

    Invariants: ``len(self)`` is the number of parts (one u32 key group
    each), and the constructor has checked the shape that does not need a
    pass over the parts: key groups and counts hold one u32 per part, sizes
    whole u32s, and a call without parts holds no changes either. What needs
    a pass (the totals) is :meth:`arrays`'. Immutable after
    construction; any thread.
    """

    __slots__ = ("counts", "key_groups", "nparts", "payload", "sizes")

    def __init__(self, message: PackedMessage) -> None:
        self.key_groups = message.key_groups
        self.counts = message.counts
        self.sizes = message.sizes
        self.payload = message.payload
        kg_bytes = len(self.key_groups)
        if kg_bytes % 4 or len(self.counts) != kg_bytes or len(self.sizes) % 4:
            raise InvalidArgument(
                f"packed parts: key_groups ({kg_bytes} bytes), counts ({len(self.counts)} "
                f"bytes) and sizes ({len(self.sizes)} bytes) must hold whole u32s, one key "
                "group and one count per part"
            )
        self.nparts = kg_bytes // 4
        if not self.nparts and (self.sizes or self.payload):
            raise InvalidArgument("packed parts: changes without a key group")

    def __len__(self) -> int:
        return self.nparts

    @property
    def nbytes(self) -> int:
        """Bytes of sizes and payload."""
        return len(self.sizes) + len(self.payload)

    def arrays(self) -> tuple[list[int], array[int], array[int]]:
        """The key groups, counts and sizes as integers, the totals checked.

        Raises :class:`InvalidArgument` when the counts and the sizes, or the sizes
        and the payload, disagree in total (no part can then be told apart). With
        the totals right, each part's sizes add up to its payload by construction.
        """
        counts = _u32s(self.counts)
        sizes = _u32s(self.sizes)
        total = sum(counts)
        if 4 * total != len(self.sizes):
            raise InvalidArgument(
                f"packed parts: the counts add up to {total} changes, sizes holds "
                f"{len(self.sizes) // 4}"
            )
        payload_total = sum(sizes)
        if payload_total != len(self.payload):
            raise InvalidArgument(
                f"packed parts: the sizes add up to {payload_total} bytes, payload holds "
                f"{len(self.payload)}"
            )
        return _u32s(self.key_groups).tolist(), counts, sizes
