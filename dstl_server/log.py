"""One writer's log and the writer contract: its parts, SQNs, persists and uploads.

:class:`WriterLog` checks a call's parts, appends them, assembles a persist
(what is new goes to upload, what is uploaded or uploading is reused) and
records how each of its uploads ended (:meth:`WriterLog.upload_done`).
The registry finds the writer, runs its calls in order and counts memory.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

from dstl_client.core.errors import SqnOutOfRange, WriterClosed
from dstl_client.core.format import Changeset, PackedChanges, PackedGroups
from dstl_client.core.handle import ChangelogHandle, HandleEntry
from dstl_server.call_order import CallSequencer
from dstl_server.parts import (
    PART_OVERHEAD_BYTES,
    CallParts,
    CheckedParts,
    check_call,
    check_count,
    check_key_group,
    held_bytes,
)
from dstl_server.upload_task import UploadTask
from dstl_server.uploads import Uploads

__all__ = [
    "INITIAL_SQN",
    "PART_OVERHEAD_BYTES",
    "CheckedParts",
    "PendingPersist",
    "WriterLog",
    "held_bytes",
]

INITIAL_SQN = 0


@dataclass(frozen=True, slots=True)
class PendingPersist:
    """A persist between the end of its turn and its handle."""

    log: WriterLog
    after: int
    to_sqn: int
    sections: list[HandleEntry | UploadTask]
    started: float


class WriterLog:
    """One writer: its SQN counter and its changesets in every state.

    A change is tagged with ``active_sqn``. ``rollover`` closes the active
    changeset (if it holds anything) and bumps ``active_sqn``; so the value
    returned to callers is a boundary: changes before it have smaller SQNs.

    Every closed changeset is in exactly one of ``not_uploaded``,
    ``uploading`` (its :class:`~dstl_server.uploads.UploadTask`) or
    ``uploaded`` (its handle entry; the data is gone from memory) until
    ``truncate`` drops it. Changesets move into ``uploading`` when an upload
    starts (:meth:`upload_started`, told by
    :class:`~dstl_server.uploads.Uploads`) and out of it when it ends
    (:meth:`upload_done`): both here, the writer's maps have no other writer.

    Memory is counted in one place, the
    :class:`~dstl_server.throttle.MemoryBudget`: the registry charges what
    ``append`` adds (data + :data:`PART_OVERHEAD_BYTES` per part) and
    releases what ``truncate`` and ``close`` return as freed; the upload
    engine releases what :meth:`upload_done` returns. ``active_bytes`` is
    the size of the active changeset (the pre-emptive upload threshold), not
    a second memory count.

    Event-loop only: no locks, every method runs to completion.
    """

    def __init__(self, job_id: str, operator_id: str, key_group_range: tuple[int, int]) -> None:
        self.log_id_bytes = uuid.uuid4().bytes
        self.log_id = self.log_id_bytes.hex()
        self.job_id = job_id
        self.operator_id = operator_id
        self.key_group_range = key_group_range
        self.active_sqn = INITIAL_SQN
        self.active: dict[int, list[PackedChanges]] | PackedGroups = {}
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
        check_key_group(key_group, self.key_group_range, self.log_id)

    def check_parts(self, parts: CallParts, limit: int) -> CheckedParts:
        """Check every part of a call before any is applied (typed errors), by
        :func:`~dstl_server.parts.check_call`; a closed writer refuses any."""
        check_count(parts)
        self.check_open()
        return check_call(parts, self.key_group_range, self.log_id, limit)

    def append(self, key_group: int, packed: PackedChanges) -> None:
        self.append_parts([(key_group, packed)], packed.nbytes)

    def append_parts(
        self, parts: list[tuple[int, PackedChanges]] | PackedGroups, nbytes: int
    ) -> None:
        """Append validated parts (key group, changes) holding ``nbytes`` of sizes and payload.

        One call per request: the sizes are counted once, by the caller, so
        the changeset's size is known without a pass over its parts. A packed
        call's parts become the changeset, encoded under its SQN
        (:meth:`~dstl_client.core.format.PackedGroups.seal`), when it is the
        changeset's first call (a checkpoint's usual one); else they are split.
        """
        active = self.active
        if isinstance(parts, PackedGroups):
            if not active:  # encoded now, in the append's turn, not in the persist's
                parts.seal(self.active_sqn)
                self.active = parts
                self.active_parts = len(parts)
                self.active_bytes = nbytes + PART_OVERHEAD_BYTES * len(parts)
                return
            parts = parts.split()
        if isinstance(active, PackedGroups):  # a second call: the changeset becomes a dict
            active = self.active = {kg: [part] for kg, part in active.split()}
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
    def begin_persist(self, after: int, uploads: Uploads) -> PendingPersist:
        """Close the changeset, upload what is new, collect the sections (in the call's turn).

        Every change with SQN >= ``after`` is then in an uploaded entry or a
        running upload; the handle is :meth:`await_handle`'s.
        """
        started = time.perf_counter()
        self.check_open()
        self.check_persist_from(after)
        to_sqn = self.rollover()
        new = self.take_not_uploaded(after)
        if new:
            uploads.start(self, new, preemptive=False)
        else:
            uploads.persist_queued(self)
        return PendingPersist(self, after, to_sqn, self.sections_from(after), started)

    async def await_handle(self, pending: PendingPersist) -> ChangelogHandle:
        """Wait for the uploads ``pending`` needs; its handle (after the turn)."""
        entries: list[HandleEntry] = []
        for section in pending.sections:
            if isinstance(section, UploadTask):
                entry = await asyncio.shield(section.future)
            else:
                entry = section
            if not entries or entries[-1] != entry:
                entries.append(entry)
        return ChangelogHandle(
            self.job_id,
            self.log_id,
            self.key_group_range,
            pending.after,
            pending.to_sqn,
            tuple(entries),
        )

    def upload_all(self, uploads: Uploads) -> None:
        """Close the changeset and upload all not uploaded, persist or not (pre-emptive)."""
        self.rollover()
        changesets = self.take_not_uploaded(None)
        if changesets:
            uploads.start(self, changesets, preemptive=True)

    # ------------------------------------------------------------- uploads
    def upload_started(self, task: UploadTask) -> None:
        """``task`` uploads its changesets (taken out of not-uploaded): they are uploading."""
        for cs in task.changesets:
            self.uploading[cs.sqn] = task

    def upload_done(self, task: UploadTask) -> int:
        """Record how ``task`` ended; return the bytes no longer held (for the budget).

        Success: the writer keeps the handle entry of each changeset it still
        needs (open, not truncated past it), the data is freed. Failure: the
        changesets go back to not-uploaded (the next persist uploads them
        again) unless the writer was closed or truncated past them, which
        frees them.
        """
        fut = task.future
        entry = None if fut.cancelled() or fut.exception() is not None else fut.result()
        freed = 0
        for cs in task.changesets:
            if self.uploading.get(cs.sqn) is task:
                del self.uploading[cs.sqn]
            keep = not self.closed and cs.sqn >= self.truncated_before
            if entry is not None:
                freed += held_bytes(cs)
                if keep:
                    self.uploaded[cs.sqn] = entry
            elif keep:
                self.not_uploaded[cs.sqn] = cs
            else:
                freed += held_bytes(cs)
        return freed

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
