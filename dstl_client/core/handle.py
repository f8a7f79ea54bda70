"""Changelog handles: what ``persist_durably`` returns and a reader consumes.

A handle is an ordered list of log sections (object key, offset, length,
SQN range) plus the key-group range of its writer and the SQN range it gives
access to. It refers to exactly one writer's changes: readers never filter by
log id, only by SQN (sections may hold older changesets that a materialization
already covers) and by key group (rescaling).

Handles travel from executors to the driver as bytes (``to_bytes``), encoded
as the ``dstl.v1.Handle`` protobuf message with a version field.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import InvalidHandle

HANDLE_VERSION = 1

#: bounds of a handle's numbers: anything larger cannot come from a sidecar
#: (objects are far smaller), so it is refused before any read is sized by it
MAX_OBJECT_OFFSET = 1 << 40
MAX_SECTION_BYTES = 1 << 34
MAX_SQN = (1 << 63) - 1
MAX_KEY_GROUP = (1 << 24) - 1
MAX_ENTRIES = 100_000
MAX_OBJECT_KEY_CHARS = 1024


@dataclass(frozen=True, slots=True)
class HandleEntry:
    """One log section of one object: ``[first_sqn, end_sqn)`` of one writer."""

    object_key: str
    offset: int
    length: int
    first_sqn: int
    end_sqn: int


@dataclass(frozen=True, slots=True)
class ChangelogHandle:
    """Durable changes of one writer with ``from_sqn <= SQN < to_sqn``."""

    job_id: str
    log_id: str
    key_group_range: tuple[int, int]
    from_sqn: int
    to_sqn: int
    entries: tuple[HandleEntry, ...]

    def __post_init__(self) -> None:
        first, last = self.key_group_range
        if not 0 <= first <= last <= MAX_KEY_GROUP:
            raise InvalidHandle(f"bad key-group range {self.key_group_range}")
        if not 0 <= self.from_sqn <= self.to_sqn <= MAX_SQN:
            raise InvalidHandle(f"bad SQN range [{self.from_sqn}, {self.to_sqn})")
        if len(self.entries) > MAX_ENTRIES:
            raise InvalidHandle(f"{len(self.entries)} entries (at most {MAX_ENTRIES})")
        prev_end = -1
        for e in self.entries:
            if (
                not e.object_key
                or len(e.object_key) > MAX_OBJECT_KEY_CHARS
                or not 0 <= e.offset <= MAX_OBJECT_OFFSET
                or not 0 < e.length <= MAX_SECTION_BYTES
                or not 0 <= e.first_sqn < e.end_sqn <= MAX_SQN
            ):
                raise InvalidHandle(f"bad handle entry {_short(e)}")
            if e.first_sqn < prev_end:
                raise InvalidHandle("handle entries overlap or are out of SQN order")
            prev_end = e.end_sqn
        if len(self.log_id) != 32:
            raise InvalidHandle(f"bad log id {self.log_id[:40]!r}")
        try:
            bytes.fromhex(self.log_id)
        except ValueError as exc:
            raise InvalidHandle(f"bad log id {self.log_id!r}") from exc

    @property
    def object_keys(self) -> tuple[str, ...]:
        """Distinct object keys, in order (the shared-state registry's keys)."""
        return tuple(dict.fromkeys(e.object_key for e in self.entries))

    @property
    def stored_bytes(self) -> int:
        """Bytes of the log sections this handle points to."""
        return sum(e.length for e in self.entries)

    def is_empty(self) -> bool:
        return not self.entries

    # ---------------------------------------------------------------- codec
    def to_proto(self) -> pb.Handle:
        return pb.Handle(
            format_version=HANDLE_VERSION,
            job_id=self.job_id,
            log_id=self.log_id,
            first_key_group=self.key_group_range[0],
            last_key_group=self.key_group_range[1],
            from_sqn=self.from_sqn,
            to_sqn=self.to_sqn,
            entries=[
                pb.HandleEntry(
                    object_key=e.object_key,
                    offset=e.offset,
                    length=e.length,
                    first_sqn=e.first_sqn,
                    end_sqn=e.end_sqn,
                )
                for e in self.entries
            ],
        )

    @classmethod
    def from_proto(cls, msg: pb.Handle) -> ChangelogHandle:
        """The handle ``msg`` encodes, checked; its entries are counted before any is built."""
        if msg.format_version != HANDLE_VERSION:
            raise InvalidHandle(f"unsupported handle version {msg.format_version}")
        n = len(msg.entries)
        if n > MAX_ENTRIES:
            raise InvalidHandle(f"{n} entries (at most {MAX_ENTRIES})")
        return cls(
            job_id=msg.job_id,
            log_id=msg.log_id,
            key_group_range=(msg.first_key_group, msg.last_key_group),
            from_sqn=msg.from_sqn,
            to_sqn=msg.to_sqn,
            entries=tuple(
                HandleEntry(e.object_key, e.offset, e.length, e.first_sqn, e.end_sqn)
                for e in msg.entries
            ),
        )

    def to_bytes(self) -> bytes:
        """Serialize (stable across processes and versions of this library)."""
        return bytes(self.to_proto().SerializeToString(deterministic=True))

    @classmethod
    def from_bytes(cls, data: bytes) -> ChangelogHandle:
        """Inverse of :meth:`to_bytes`; raises :class:`InvalidHandle` on bad bytes."""
        msg = pb.Handle()
        try:
            msg.ParseFromString(data)
        except DecodeError as exc:
            raise InvalidHandle(f"handle bytes do not decode: {exc}") from exc
        return cls.from_proto(msg)

    @staticmethod
    def combine(handles: Iterable[ChangelogHandle]) -> ChangelogHandle:
        """Concatenate consecutive handles of one writer into one."""
        hs = list(handles)
        if not hs:
            raise InvalidHandle("nothing to combine")
        first = hs[0]
        entries: list[HandleEntry] = []
        for prev, nxt in itertools.pairwise(hs):
            if nxt.log_id != first.log_id or nxt.from_sqn != prev.to_sqn:
                raise InvalidHandle("handles are not consecutive ranges of one log")
        for h in hs:
            for e in h.entries:
                if not entries or entries[-1] != e:
                    entries.append(e)
        return ChangelogHandle(
            first.job_id,
            first.log_id,
            first.key_group_range,
            first.from_sqn,
            hs[-1].to_sqn,
            tuple(entries),
        )


def _short(entry: HandleEntry) -> str:
    """An entry for an error message, with its key cut short."""
    key = entry.object_key if len(entry.object_key) <= 80 else entry.object_key[:77] + "..."
    return (
        f"(key={key!r}, offset={entry.offset}, length={entry.length}, "
        f"sqn=[{entry.first_sqn}, {entry.end_sqn}))"
    )
