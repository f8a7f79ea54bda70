"""A writer's calls in the order its client made them.

:class:`CallSequencer` (one per writer) orders the calls of one writer;
:class:`CallOrder` (one per node, owned by the registry) runs the ordered
part of a call in its turn, admits what calls carry into the node's memory
budget before they wait, and fails a session when a call that carried
changes is refused inside its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from dstl_client.core.errors import (
    Backpressure,
    BudgetFull,
    CallLost,
    DstlError,
    InvalidArgument,
    WriterFailed,
)
from dstl_client.core.format import MAX_PARTS_PER_REQUEST
from dstl_server.metrics import ServerMetrics
from dstl_server.parts import CallParts, carries_changes, charge_of
from dstl_server.throttle import MemoryBudget


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


class OrderedWriter(Protocol):
    """A writer as :class:`CallOrder` sees it (:class:`~dstl_server.log.WriterLog`)."""

    @property
    def log_id(self) -> str: ...

    @property
    def calls(self) -> CallSequencer: ...


class CallOrder:
    """Runs the ordered part of every writer's calls in client order.

    :meth:`turn` waits until every earlier call of the writer's session has
    finished its ordered part (the writer's :class:`CallSequencer`) and lets
    the next call in when the body ends, however it ends. A call that
    carries changes is admitted into the node's one memory budget
    (:meth:`~dstl_server.throttle.MemoryBudget.admitted`) *before* it waits
    for its turn, and holds its bytes there until its append takes them
    over: the bytes of calls waiting for an earlier call (*parked*) count in
    the same bound as the bytes not yet uploaded. A call that finds the
    budget full is refused at once with
    :class:`~dstl_client.core.errors.BudgetFull` before it takes a turn
    (nothing applied, no gap: the client sends it again with the same
    ``seq``); a writer pushed back past ``backpressure_timeout_s`` gets
    :class:`~dstl_client.core.errors.Backpressure` and, as the call carried
    changes, its session fails. :meth:`changes_land` wraps the part of a
    turn that applies a call's changes: if they are refused, or the call is
    cancelled there, the session fails with :class:`WriterFailed`, so no
    later call of the session is applied over the hole. Validation belongs
    inside the turn: a refused call still takes its turn and never leaves a
    gap.

    Invariant: ``parked`` is the sum of the request bytes (as the budget
    charges them) of the change-carrying calls waiting in :meth:`turn` for
    an earlier call right now (the ``dstl_parked_bytes`` gauge); they are
    part of the budget's ``held``. Event-loop only; the registry's ordered
    calls (``append``, ``persist``, ``truncate``, ``last_appended_sqn``) are
    its only callers.
    """

    def __init__(self, budget: MemoryBudget, timeout_s: float, metrics: ServerMetrics) -> None:
        self.budget = budget
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.parked = 0

    @contextlib.asynccontextmanager
    async def turn(
        self, wl: OrderedWriter, session: int, seq: int, parts: CallParts = ()
    ) -> AsyncIterator[None]:
        """Run the body after the earlier calls of ``session``; ``seq == 0`` is unordered."""
        if not (parts and seq and len(parts) <= MAX_PARTS_PER_REQUEST):
            async with self._ordered(wl, session, seq, 0):
                yield
            return
        charge = charge_of(parts)
        self.check_room(wl, session, seq)
        calls = wl.calls
        expected = calls.next_seq if session == calls.session else 1
        with self.budget.admitted(charge, wl.log_id):  # room: checked just above
            async with self._ordered(wl, session, seq, charge if seq != expected else 0):
                yield

    def check_room(self, wl: OrderedWriter, session: int, seq: int) -> None:
        """Refuse a call of ``wl`` that carries changes unless the budget has room for it.

        What :meth:`turn` does before it admits a call, also used for a call
        refused before it was decoded (:mod:`dstl_server.calls`):
        :class:`BudgetFull` (nothing applied, no turn taken: the client sends
        it again with the same ``seq``) or, for a writer pushed back past
        ``backpressure_timeout_s``, :class:`Backpressure`, which fails the
        session (``seq == 0``, unordered: always BudgetFull, no writer's
        clock). Each refusal counts in ``dstl_backpressure_waits_total``.
        """
        try:
            self.budget.check_room(wl.log_id if seq else "")
        except BudgetFull:
            self.metrics.backpressure_waits.inc()
            raise
        except Backpressure as exc:
            self.metrics.backpressure_waits.inc()
            self._fail(wl, session, WriterFailed(exc.message))
            raise

    @contextlib.asynccontextmanager
    async def _ordered(
        self, wl: OrderedWriter, session: int, seq: int, parked: int
    ) -> AsyncIterator[None]:
        calls = wl.calls
        if parked:
            self._park(parked)
        try:
            await calls.enter(session, seq, self.timeout_s)
        finally:
            if parked:
                self._park(-parked)
        try:
            yield
        finally:
            calls.leave(session, seq)

    def changes_land(
        self, wl: OrderedWriter, session: int, seq: int, parts: CallParts
    ) -> AbstractContextManager[None]:
        """Fail ``session`` if the body (applying ``parts``) raises or is cancelled.

        ``seq == 0`` (unordered): no session to fail, nothing around the body.
        """
        if not seq:
            return contextlib.nullcontext()
        return self._landing(wl, session, seq, parts)

    @contextlib.contextmanager
    def _landing(
        self, wl: OrderedWriter, session: int, seq: int, parts: CallParts
    ) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            if carries_changes(parts):
                why = f"{exc.kind}: {exc.message}" if isinstance(exc, DstlError) else repr(exc)
                self._fail(
                    wl,
                    session,
                    WriterFailed(
                        f"call {seq} of writer {wl.log_id} carried changes and was refused "
                        f"({why}); later calls are refused so that no handle misses them: "
                        "recreate the writer and recover from the last checkpoint"
                    ),
                )
            raise

    def _fail(self, wl: OrderedWriter, session: int, exc: DstlError) -> None:
        wl.calls.fail(session, exc)
        self.metrics.sessions_failed.inc()

    def _park(self, nbytes: int) -> None:
        self.parked += nbytes
        self.metrics.parked_bytes.set(self.parked)
