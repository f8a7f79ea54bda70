"""One writer's requests on a writer stream (``Session`` or ``Mux``): its lane.

A ``Session`` stream has one lane; a ``Mux`` stream one per writer it
carries (:mod:`dstl_server.session`). Everything that is per writer lives
here, so a writer's refusal never reaches its siblings on a shared stream:

* **order** -- the stream hands the lane its requests in stream order, one
  at a time, and each one's ordered part runs before the next is handed
  over: the writer's call order, no ``session``/``seq``;
* **binding** -- a lane serves one log, bound by its first request after
  the job that owns the log was checked against the stream's principal
  (:meth:`~dstl_server.calls.Calls.owned_log`, admin refused);
* **persist** -- its ordered part runs in turn, then a task waits for the
  uploads and answers; at most :data:`MAX_WAITING_PERSISTS` wait per lane,
  beyond which the stream reads no further message until one is answered;
* **sticky failure** -- once a request that carried changes is refused,
  every later request of the lane is refused with :class:`WriterFailed`;
* **memory** -- a request with changes is admitted into the budget before
  it runs; when the budget is full it is refused with :class:`BudgetFull`
  (nothing applied) and so is every later request of the lane, until one
  comes with ``resend`` set (a ``Mux`` client sends the refused request and
  the later ones again, in order; a ``Session`` client opens a new stream).

Answers go to the stream's :class:`~dstl_server.session_outbox.Outbox`.
Event-loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    Backpressure,
    BudgetFull,
    DstlError,
    InvalidArgument,
    ShuttingDown,
    WriterFailed,
)
from dstl_server.calls import Calls, Unread, check_decoded
from dstl_server.log import PendingPersist
from dstl_server.parts import CallParts, charge_of, parts_of

if TYPE_CHECKING:
    from dstl_server.auth import Principal
    from dstl_server.session_outbox import Outbox

log = logging.getLogger(__name__)

#: persists of one writer of a stream waiting for their handles at most; the
#: stream reads no further message while this many wait
MAX_WAITING_PERSISTS = 16


class WriterLane:
    """One writer's state on one stream (see the module docs).

    Invariants: ``log_id`` is set once (bound) and never changes; ``_lost``
    and ``_full`` are set by a refusal, ``_full`` cleared only by a request
    with ``resend``; at most :data:`MAX_WAITING_PERSISTS` persist tasks.
    ``charged`` is the budget charge of the lane's requests admitted since
    the stream last reset it (the stream's next read expects as much).
    """

    __slots__ = (
        "_calls",
        "_full",
        "_lost",
        "_outbox",
        "_persists",
        "_principal",
        "_registry",
        "_slots",
        "charged",
        "log_id",
        "single",
    )

    def __init__(
        self, calls: Calls, principal: Principal | None, outbox: Outbox, *, single: bool
    ) -> None:
        self._calls = calls
        self._registry = calls.registry
        self._principal = principal
        self._outbox = outbox
        #: a Session stream's only lane: requests may leave the log id out
        self.single = single
        self.log_id = ""
        self._lost: DstlError | None = None
        self._full: BudgetFull | None = None
        self._persists: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_WAITING_PERSISTS)
        self.charged = 0

    @property
    def clean(self) -> bool:
        """Nothing sticky and nothing waiting: the lane may be forgotten."""
        return self._lost is None and self._full is None and not self._persists

    def bind(self, log_id: str) -> str:
        """The lane's log; the first request binds it, if the caller's job owns it."""
        if self.log_id:
            if log_id and log_id != self.log_id:
                raise InvalidArgument(
                    f"this stream is bound to writer {self.log_id}; a request named "
                    f"{log_id[:64]!r} (open one stream per writer)"
                )
            return self.log_id
        if not log_id:
            raise InvalidArgument("the first request of a Session stream must name its log id")
        self._registry.owned(self._principal, log_id, admin_ok=False)
        self.log_id = log_id
        return log_id

    # ------------------------------------------------------------ requests
    async def handle(self, req: pb.SessionRequest) -> None:
        """Run one request in its turn; its answer goes to the outbox (now or later)."""
        rid = req.id
        which = req.WhichOneof("call")
        calls = self._calls
        if not self._entered(rid):
            return
        handed_over = False
        carries = False
        try:
            if self._full is not None:
                if not req.resend:
                    raise self._full  # not applied before the refused request it follows
                self._full = None  # sent again, in order: the refusals end here
            if which == "append":
                carries = True
                call = req.append
                log_id = self.bind(call.log_id)
                self._check_lost()
                parts = parts_of(call)
                with self._admitted(log_id, parts):
                    sqn = await self._registry.append(log_id, parts)
                self._outbox.put(pb.SessionResponse(id=rid, sqn=sqn))
            elif which == "persist":
                persist = req.persist
                carries = len(persist.changes) > 0 or persist.HasField("packed")
                log_id = self.bind(persist.log_id)
                self._check_lost()
                parts = parts_of(persist)
                await self._slots.acquire()
                try:
                    with self._admitted(log_id, parts):
                        pending = await self._registry.begin_persist(log_id, persist.after, parts)
                except BaseException:
                    self._slots.release()
                    raise
                task = asyncio.get_running_loop().create_task(
                    self._answer_persist(rid, pending), name=f"dstl-session-persist-{rid}"
                )
                self._persists.add(task)
                task.add_done_callback(self._persists.discard)
                handed_over = True  # the task answers and leaves
            elif which == "last_appended_sqn":
                log_id = self.bind(req.last_appended_sqn.log_id)
                self._check_lost()
                sqn = await self._registry.last_appended_sqn(log_id)
                self._outbox.put(pb.SessionResponse(id=rid, sqn=sqn))
            elif which == "truncate":
                log_id = self.bind(req.truncate.log_id)
                self._check_lost()
                await self._registry.truncate(log_id, req.truncate.before)
                self._outbox.put(pb.SessionResponse(id=rid))
            else:
                # an empty call, or one this sidecar does not know: it may have
                # carried changes, so later requests must not apply over it
                carries = True
                raise InvalidArgument(f"request {rid} of the stream names no known call")
        except DstlError as exc:
            self.refusal(rid, exc, carries)
        finally:
            if not handed_over:
                calls.leave()

    async def handle_unread(self, unread: Unread) -> None:
        """A request with changes received while the budget had no room (left undecoded):
        refused like a decoded one the budget has no room for, or handled if room came."""
        header = unread.header
        rid = header.request_id
        calls = self._calls
        if not self._entered(rid):
            return
        try:
            if self._full is not None:
                raise self._full
            log_id = self.bind(header.log_id)
            self._check_lost()
            if not self._registry.budget.has_room:
                self._check_room(log_id)  # raises
        except DstlError as exc:
            unread.drop()
            self.refusal(rid, exc, carries=True)
            return
        finally:
            calls.leave()
        req = unread.decode()  # room after all: decoded and handled as usual
        if type(req) is not pb.SessionRequest:
            check_decoded(req)
        await self.handle(req)

    def _entered(self, rid: int) -> bool:
        """Count request ``rid`` as a call in flight; while draining it is answered with
        :class:`ShuttingDown` instead (False)."""
        try:
            self._calls.enter()
        except ShuttingDown as exc:
            self._refuse(rid, exc)
            return False
        return True

    def refusal(self, rid: int, exc: DstlError, carries: bool) -> None:
        """Answer request ``rid`` with ``exc``; what later requests of the lane get then."""
        if isinstance(exc, BudgetFull):  # nothing applied: neither this request nor later ones
            if self._full is None:
                self._full = BudgetFull(
                    f"request {rid} of this stream was refused ({exc.message}); later "
                    "requests of the writer are refused until it is sent again"
                )
        elif carries and self._lost is None and not isinstance(exc, WriterFailed):
            self._lost = WriterFailed(
                f"request {rid} of writer {self.log_id or '?'}'s stream carried changes "
                f"and was refused ({exc.kind}: {exc.message}); later requests are refused "
                "so that no handle misses them: recreate the writer and recover from the "
                "last checkpoint"
            )
            self._calls.metrics.sessions_failed.inc()
        self._refuse(rid, exc)

    def _check_lost(self) -> None:
        if self._lost is not None:
            raise self._lost

    def _admitted(self, log_id: str, parts: CallParts) -> AbstractContextManager[None]:
        """The budget's hold of a request's changes while it runs (none for no changes)."""
        if not parts:
            return contextlib.nullcontext()
        self._check_room(log_id)
        charge = charge_of(parts)
        self.charged += charge
        return self._registry.budget.admitted(charge, log_id)

    def _check_room(self, log_id: str) -> None:
        """Refuse a request with changes unless the budget has room (BudgetFull, or
        Backpressure for a writer pushed back too long), counted."""
        try:
            self._registry.budget.check_room(log_id)
        except Backpressure:  # BudgetFull, or pushed back too long
            self._calls.metrics.backpressure_waits.inc()
            raise

    async def _answer_persist(self, rid: int, pending: PendingPersist) -> None:
        """Wait for the persist's uploads; answer with its handle or its error."""
        try:
            try:
                handle = await self._registry.await_handle(pending)
                out = pb.SessionResponse(id=rid, handle=handle.to_proto())
            except Exception as exc:  # typed, or a bug (logged; the client sees "internal")
                out = self._calls.stream_error(rid, exc)
            self._outbox.put(out, persist=True)
        finally:
            self._slots.release()
            self._calls.leave()

    def _refuse(self, rid: int, exc: DstlError) -> None:
        """Answer request ``rid`` with ``exc`` (counted like a unary refusal)."""
        self._outbox.put(self._calls.stream_error(rid, exc))

    # ------------------------------------------------------------ ending
    async def wait_persists(self) -> None:
        """Until every waiting persist of the lane is answered."""
        while self._persists:
            await asyncio.wait(set(self._persists))

    async def cancel_persists(self) -> None:
        for task in self._persists:
            task.cancel()
        if self._persists:
            await asyncio.wait(set(self._persists))
