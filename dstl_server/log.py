"""The state of one writer's log: SQNs, changesets and where they were uploaded."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Protocol

from dstl_client.core.errors import KeyGroupOutOfRange, SqnOutOfRange, WriterClosed
from dstl_client.core.format import Changeset, PackedChanges
from dstl_client.core.handle import HandleEntry
from dstl_server.call_order import CallSequencer

if TYPE_CHECKING:
    from dstl_server.uploads import UploadTask

INITIAL_SQN = 0

#: what the sidecar holds per appended key-group part beyond its bytes (the
#: part object, its two bytes objects and its list/dict slots), charged to the
#: memory budget so that many tiny parts cannot hold memory the budget misses
PART_OVERHEAD_BYTES = 256


def held_bytes(changeset: Changeset) -> int:
    """Bytes the budget charges for a changeset: data plus per-part overhead."""
    return changeset.nbytes + PART_OVERHEAD_BYTES * changeset.nparts


class ChangePart(Protocol):
    """One key group's changes as a call carries them (``dstl.v1.KeyGroupChanges``).

    ``sizes`` holds ``count`` little-endian u32 lengths, ``payload`` the
    changes back to back: the on-disk encoding, never split into changes.
    """

    @property
    def key_group(self) -> int: ...

    @property
    def count(self) -> int: ...

    @property
    def sizes(self) -> bytes: ...

    @property
    def payload(self) -> bytes: ...


class WriterLog:
    """One writer: its SQN counter and its changesets in every state.

    A change is tagged with ``active_sqn``. ``rollover`` closes the active
    changeset (if it holds anything) and bumps ``active_sqn``; so the value
    returned to callers is a boundary: changes before it have smaller SQNs.

    Every closed changeset is in exactly one of ``not_uploaded``,
    ``uploading`` (its :class:`~dstl_server.uploads.UploadTask`) or
    ``uploaded`` (its handle entry; the data is gone from memory) until
    ``truncate`` drops it. Changesets move into and out of ``uploading`` only
    in :mod:`dstl_server.uploads` (the one owner of an upload's lifecycle).

    Memory is counted in one place, the
    :class:`~dstl_server.throttle.MemoryBudget`: the registry charges what
    ``append`` adds (data + :data:`PART_OVERHEAD_BYTES` per part) and
    releases what ``truncate``, ``close`` and a finished upload return as
    freed. ``active_bytes`` is the size of the active changeset (the
    pre-emptive upload threshold), not a second memory count.

    Event-loop only: no locks, every method runs to completion.
    """

    def __init__(self, job_id: str, operator_id: str, key_group_range: tuple[int, int]) -> None:
        self.log_id_bytes = uuid.uuid4().bytes
        self.log_id = self.log_id_bytes.hex()
        self.job_id = job_id
        self.operator_id = operator_id
        self.key_group_range = key_group_range
        self.active_sqn = INITIAL_SQN
        self.active: dict[int, list[PackedChanges]] = {}
        self.active_bytes = 0
        #: parts in the active changeset (its ``nparts``, known at rollover)
        self.active_parts = 0
        self.not_uploaded: dict[int, Changeset] = {}
        self.uploading: dict[int, UploadTask] = {}
        self.uploaded: dict[int, HandleEntry] = {}
        self.truncated_before = INITIAL_SQN
        self.closed = False
        self.calls = CallSequencer()
        #: loop time of the writer's last call (the idle-writer sweep reads it)
        self.last_call = 0.0

    @property
    def pending_bytes(self) -> int:
        """Bytes this writer holds in memory, derived from its changesets (not a counter).

        Active + not uploaded + uploading, as the budget charged them: a
        diagnostic view of the writer's share; the budget's ``used`` counts.
        """
        closed = [*self.not_uploaded.values()]
        closed += [cs for task in set(self.uploading.values()) for cs in task.changesets]
        return self.active_bytes + sum(held_bytes(cs) for cs in closed)

    # ------------------------------------------------------------- appends
    def check_open(self) -> None:
        if self.closed:
            raise WriterClosed(f"writer {self.log_id} is closed")

    def check_key_group(self, key_group: int) -> None:
        first, last = self.key_group_range
        if not first <= key_group <= last:
            raise KeyGroupOutOfRange(
                f"key group {key_group} is outside writer {self.log_id}'s range [{first}, {last}]"
            )

    def append(self, key_group: int, packed: PackedChanges) -> None:
        self.append_parts([(key_group, packed)], packed.nbytes)

    def append_parts(self, parts: list[tuple[int, PackedChanges]], nbytes: int) -> None:
        """Append validated parts (key group, changes) holding ``nbytes`` of sizes and payload.

        One call per request: the sizes are counted once, by the caller, so
        the changeset's size is known without a pass over its parts.
        """
        active = self.active
        for kg, packed in parts:
            group = active.get(kg)
            if group is None:
                active[kg] = [packed]
            else:
                group.append(packed)
        self.active_parts += len(parts)
        self.active_bytes += nbytes + PART_OVERHEAD_BYTES * len(parts)

    def rollover(self) -> int:
        """Close the active changeset; return the new boundary SQN."""
        if self.active:
            nparts = self.active_parts
            self.not_uploaded[self.active_sqn] = Changeset(
                self.active_sqn,
                self.active,
                _nbytes=self.active_bytes - PART_OVERHEAD_BYTES * nparts,
                _nparts=nparts,
            )
            self.active = {}
            self.active_bytes = 0
            self.active_parts = 0
            self.active_sqn += 1
        return self.active_sqn

    # ------------------------------------------------------------- persists
    def check_persist_from(self, after: int) -> None:
        if after > self.active_sqn:
            raise SqnOutOfRange(
                f"persist after SQN {after}: writer {self.log_id} is only at {self.active_sqn}"
            )
        if after < self.truncated_before:
            raise SqnOutOfRange(
                f"persist after SQN {after}: changes below {self.truncated_before} were truncated"
            )

    def take_not_uploaded(self, after: int | None) -> list[Changeset]:
        """Remove and return the not-uploaded changesets with SQN >= ``after`` in order."""
        sqns = sorted(s for s in self.not_uploaded if after is None or s >= after)
        return [self.not_uploaded.pop(s) for s in sqns]

    def sections_from(self, after: int) -> list[HandleEntry | UploadTask]:
        """Uploaded entries and running tasks covering SQNs >= ``after``, in SQN order."""
        found: dict[int, HandleEntry | UploadTask] = {}
        for sqn, entry in self.uploaded.items():
            if sqn >= after:
                found[sqn] = entry
        for sqn, task in self.uploading.items():
            if sqn >= after:
                found[sqn] = task
        out: list[HandleEntry | UploadTask] = []
        for sqn in sorted(found):
            item = found[sqn]
            if not out or out[-1] != item:
                out.append(item)
        return out

    # ----------------------------------------------------------- truncation
    def truncate(self, before: int) -> int:
        """Drop changesets with SQN < ``before``; return bytes freed from memory."""
        if before > self.active_sqn:
            raise SqnOutOfRange(
                f"truncate before SQN {before}: writer {self.log_id} is only at {self.active_sqn}"
            )
        if before <= self.truncated_before:
            return 0
        self.truncated_before = before
        freed = 0
        for sqn in [s for s in self.not_uploaded if s < before]:
            freed += held_bytes(self.not_uploaded.pop(sqn))
        for sqn in [s for s in self.uploaded if s < before]:
            del self.uploaded[sqn]
        return freed

    def close(self) -> int:
        """Drop active and not-uploaded changes; return bytes freed from memory.

        Uploading changesets stay charged until their upload ends (their
        bytes are still held by the upload).
        """
        self.closed = True
        freed = self.active_bytes + sum(held_bytes(cs) for cs in self.not_uploaded.values())
        self.active = {}
        self.active_bytes = 0
        self.active_parts = 0
        self.not_uploaded.clear()
        self.uploaded.clear()
        return freed
