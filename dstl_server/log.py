"""The state of one writer's log: SQNs, changesets and where they were uploaded."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from dstl_client.core.errors import (
    CallLost,
    DstlError,
    InvalidArgument,
    KeyGroupOutOfRange,
    SqnOutOfRange,
    WriterClosed,
)
from dstl_client.core.format import Changeset, PackedChanges
from dstl_client.core.handle import HandleEntry

INITIAL_SQN = 0

#: what the sidecar holds per appended key-group part beyond its bytes (the
#: part object, its two bytes objects and its list/dict slots), charged to the
#: memory budget so that many tiny parts cannot hold memory the budget misses
PART_OVERHEAD_BYTES = 256


def held_bytes(changeset: Changeset) -> int:
    """Bytes the budget charges for a changeset: data plus per-part overhead."""
    return sum(p.nbytes + PART_OVERHEAD_BYTES for parts in changeset.groups.values() for p in parts)


@dataclass(slots=True, eq=False)
class UploadTask:
    """Changesets of one writer that go into one log section of one object."""

    log: WriterLog
    changesets: list[Changeset]
    end_sqn: int
    nbytes: int
    preemptive: bool
    future: asyncio.Future[HandleEntry] = field(repr=False)


class CallSequencer:
    """Applies one writer's calls in the order its client made them.

    A client-side writer object numbers its calls 1, 2, 3... (``seq``) within
    a random ``session`` id; gRPC may hand them to the server out of order
    (an append sent after a persist must not slip into that persist's
    handle). ``enter`` waits until every earlier call of the session has
    finished its ordered part; ``leave`` lets the next one in. A call waits
    at most ``timeout_s`` for an earlier call that has *not arrived*; waiting
    behind one that has arrived (e.g. an append under backpressure) is not
    limited here. A call that never arrives fails the session with
    :class:`CallLost`. A new session (the writer reopened by a later task)
    supersedes the current one; calls of superseded sessions are refused.
    ``seq == 0`` is unordered.

    Bounded whatever numbers a caller sends: a call more than ``MAX_AHEAD``
    calls ahead of the next expected one fails the session (no client has
    that many calls of one writer in flight), so the set of arrived calls and
    the search for a missing one never exceed ``MAX_AHEAD`` entries. A
    session can also be failed explicitly (:meth:`fail`) when a call that
    carried changes was refused after it entered the order: its later calls
    must not be applied over the hole.

    Event-loop only.
    """

    _RETIRED_KEPT = 64
    #: most calls of one session that may wait for an earlier one
    MAX_AHEAD = 1024

    def __init__(self) -> None:
        self.session = 0
        self.next_seq = 1
        self._arrived: set[int] = set()
        self._turns: dict[int, asyncio.Future[None]] = {}
        self._retired: list[int] = []
        self.lost: DstlError | None = None

    def _switch(self, session: int) -> None:
        if session in self._retired:
            raise CallLost("this client of the writer was superseded by a newer one")
        if self.session:
            self._retired.append(self.session)
            del self._retired[: -self._RETIRED_KEPT]
        self.session = session
        self.next_seq = 1
        self._arrived.clear()
        self.lost = None
        self._wake_all()

    def fail(self, session: int, exc: DstlError) -> None:
        """Refuse every later call of ``session`` with ``exc`` (a call left a hole)."""
        if session == self.session and self.lost is None:
            self.lost = exc
            self._wake_all()

    def _first_missing(self, seq: int) -> int | None:
        """The first call before ``seq`` that has not arrived (at most MAX_AHEAD steps)."""
        s = self.next_seq
        while s < seq and s in self._arrived:
            s += 1
        return s if s < seq else None

    async def enter(self, session: int, seq: int, timeout_s: float) -> None:
        if seq == 0:
            return
        if session != self.session:
            self._switch(session)
        if self.lost is not None:
            raise self.lost
        if seq < self.next_seq or seq in self._arrived:
            raise InvalidArgument(f"call {seq} of this writer was already received")
        if seq - self.next_seq >= self.MAX_AHEAD:
            self.fail(
                session,
                CallLost(
                    f"call {seq} arrived while call {self.next_seq} is the next expected: "
                    f"at most {self.MAX_AHEAD} calls of a writer may be in flight; the "
                    "writer's calls are out of step, recreate it and recover from the "
                    "last checkpoint"
                ),
            )
            assert self.lost is not None
            raise self.lost
        self._arrived.add(seq)
        try:
            while seq != self.next_seq:
                fut = self._turns.get(seq)
                if fut is None or fut.done():
                    fut = self._turns[seq] = asyncio.get_running_loop().create_future()
                try:
                    await asyncio.wait_for(asyncio.shield(fut), timeout_s)
                except TimeoutError:
                    missing = self._first_missing(seq)
                    if missing is not None and session == self.session:
                        self.fail(
                            session,
                            CallLost(
                                f"call {missing} of this writer never reached the sidecar "
                                f"within {timeout_s:g}s (lost, or refused before it could "
                                "be read, e.g. larger than max_request_bytes); recreate the "
                                "writer and recover from the last checkpoint"
                            ),
                        )
                if session != self.session:
                    raise CallLost("this client of the writer was superseded by a newer one")
                if self.lost is not None:
                    raise self.lost
        except BaseException:
            if session == self.session:
                self._arrived.discard(seq)
            raise
        finally:
            if session == self.session:
                self._turns.pop(seq, None)

    def leave(self, session: int, seq: int) -> None:
        if seq == 0 or session != self.session or seq != self.next_seq:
            return
        self._arrived.discard(seq)
        self.next_seq = seq + 1
        fut = self._turns.get(self.next_seq)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _wake_all(self) -> None:
        for fut in self._turns.values():
            if not fut.done():
                fut.set_result(None)
        self._turns.clear()


class WriterLog:
    """One writer: its SQN counter and its changesets in every state.

    A change is tagged with ``active_sqn``. ``rollover`` closes the active
    changeset (if it holds anything) and bumps ``active_sqn``; so the value
    returned to callers is a boundary: changes before it have smaller SQNs.

    Every closed changeset is in exactly one of ``not_uploaded``,
    ``uploading`` (its task's future) or ``uploaded`` (its handle entry; the
    data is gone from memory) until ``truncate`` drops it. ``pending_bytes``
    counts active + not uploaded + uploading bytes, the writer's share of the
    :class:`~dstl_server.throttle.MemoryBudget`.

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
        self.not_uploaded: dict[int, Changeset] = {}
        self.uploading: dict[int, UploadTask] = {}
        self.uploaded: dict[int, HandleEntry] = {}
        self.truncated_before = INITIAL_SQN
        self.pending_bytes = 0
        self.closed = False
        self.calls = CallSequencer()
        #: loop time of the writer's last call (the idle-writer sweep reads it)
        self.last_call = 0.0

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
        parts = self.active.get(key_group)
        if parts is None:
            self.active[key_group] = [packed]
        else:
            parts.append(packed)
        n = packed.nbytes + PART_OVERHEAD_BYTES
        self.active_bytes += n
        self.pending_bytes += n

    def rollover(self) -> int:
        """Close the active changeset; return the new boundary SQN."""
        if self.active:
            self.not_uploaded[self.active_sqn] = Changeset(self.active_sqn, self.active)
            self.active = {}
            self.active_bytes = 0
            self.active_sqn += 1
        return self.active_sqn

    def unuploaded_bytes(self) -> int:
        return self.active_bytes + sum(held_bytes(cs) for cs in self.not_uploaded.values())

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

    def start_upload(self, task: UploadTask) -> None:
        for cs in task.changesets:
            self.uploading[cs.sqn] = task

    def finish_upload(self, task: UploadTask, entry: HandleEntry | None) -> int:
        """Record an upload's outcome; return the bytes the writer no longer holds.

        On success the changesets become handle entries (their data is freed);
        on failure they go back to not-uploaded, so the next persist uploads
        them again, unless the writer was closed or truncated past them.
        """
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
        self.pending_bytes -= freed
        return freed

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
        self.pending_bytes -= freed
        return freed

    def close(self) -> int:
        """Drop active and not-uploaded changes; return bytes freed from memory."""
        self.closed = True
        freed = self.active_bytes + sum(held_bytes(cs) for cs in self.not_uploaded.values())
        self.active = {}
        self.active_bytes = 0
        self.not_uploaded.clear()
        self.uploaded.clear()
        self.pending_bytes -= freed
        return freed
