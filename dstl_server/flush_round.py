"""Who a job's flush still expects in the current round: its writers' and children's persists.

A checkpoint round is one persist of each writer of the job (and one
forwarded batch of each child node); they do not reach the sidecar at the
same instant (64 writers' persists are spread over 17-22 ms on two busy
cores). :class:`RoundMembers` learns who takes part in the rounds and which
of them still owe this round's persist, so the
:class:`~dstl_server.batching.BatchingScheduler` can keep waiting past the
persist delay (up to its maximum wait) while someone it expects is missing,
and flush at once when the last of them arrives: one object per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

#: a member: ("w", log_id) for a writer, ("c", sender) for a child node
Key = tuple[str, str]
#: waited flushes in a row a member still owed its persist before it is no longer expected
FORGET_AFTER_MISSES = 2


class Participant(Protocol):
    """A writer, as the round sees it (closed writers are not waited for)."""

    @property
    def closed(self) -> bool: ...


@dataclass(slots=True)
class _Member:
    #: None for a child node (it has no "closed"); a departed child is forgotten
    writer: Participant | None
    #: waited flushes in a row that left while it still owed its persist
    misses: int = 0


class RoundMembers:
    """The members of one job's rounds and which of them still owe the current round.

    A member is a writer whose persist, or a child whose forwarded batch,
    reached the queue (keys: ``("w", log_id)``, ``("c", sender)``). A round
    begins when a member that owes nothing arrives again (its next
    checkpoint): from then on every other member owes one arrival. A member
    that owes and arrives pays (this round, or a round that the maximum wait
    closed without it: a late persist then completes that round instead of
    opening the next one). A flush that waited (the delay, the maximum wait)
    counts a miss for each member still owing; one that misses
    :data:`FORGET_AFTER_MISSES` in a row is forgotten, and a closed writer
    is dropped when found owing, so neither holds later rounds. Newcomers
    owe nothing in their first round (nobody knew to expect them).

    Invariants: ``owing`` is a subset of the members, ``children`` the
    members that are child nodes; at most ``max_writers`` writers and
    ``max_children`` children are members (newcomers beyond that are not
    tracked, never waited for). Event-loop only (the job's scheduler).
    """

    def __init__(self, *, max_writers: int, max_children: int) -> None:
        self.max_writers = max_writers
        self.max_children = max_children
        self._members: dict[Key, _Member] = {}
        self._owing: set[Key] = set()
        #: the child members' sender names
        self.children: set[str] = set()

    def __len__(self) -> int:
        return len(self._members)

    def writer_arrives(self, log_id: str, writer: Participant) -> None:
        """A persist of ``writer``: see :meth:`_arrive`."""
        if ("w", log_id) in self._members or len(self._members) - len(
            self.children
        ) < self.max_writers:
            self._arrive(("w", log_id), writer)

    def child_arrives(self, sender: str) -> None:
        """A batch forwarded by the child ``sender``: see :meth:`_arrive`."""
        if sender in self.children or len(self.children) < self.max_children:
            self.children.add(sender)
            self._arrive(("c", sender), None)

    def _arrive(self, key: Key, writer: Participant | None) -> None:
        """``key`` persisted (or forwarded): it pays what it owes, or begins a new round."""
        member = self._members.get(key)
        if member is None:
            self._members[key] = _Member(writer)
            return
        member.misses = 0
        if key in self._owing:
            self._owing.discard(key)
        else:  # its next round began: everyone else owes theirs
            self._owing = set(self._members)
            self._owing.discard(key)

    def missing(self) -> bool:
        """Whether a member (not a closed writer) still owes the current round."""
        for key in [k for k in self._owing if _closed(self._members[k])]:
            self._forget(key)
        return bool(self._owing)

    def owing(self) -> frozenset[Key]:
        return frozenset(self._owing)

    def waited(self) -> None:
        """A flush left on a timer: each member still owing misses it, and may be forgotten."""
        for key in list(self._owing):
            member = self._members[key]
            member.misses += 1
            if member.misses >= FORGET_AFTER_MISSES:
                self._forget(key)

    def _forget(self, key: Key) -> None:
        self._owing.discard(key)
        del self._members[key]
        if key[0] == "c":
            self.children.discard(key[1])


def _closed(member: _Member) -> bool:
    return member.writer is not None and member.writer.closed
