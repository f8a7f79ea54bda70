"""The ``Session`` stream: one writer's calls on one long-lived bidirectional stream.

A unary call costs the sidecar a new HTTP/2 stream, its metadata and the
authentication interceptor every time; on an open stream a request is one
message. :class:`SessionStream` serves one stream:

* **order** -- requests are read one at a time and each one's ordered part
  (what :class:`~dstl_server.registry.LogRegistry` runs in a unary call's
  turn) runs before the next request is read, so the stream's order is the
  writer's call order: no ``session``/``seq`` (those fields are ignored);
* **persist** -- its ordered part runs in turn, then a task per persist waits
  for the uploads and answers; at most :data:`MAX_WAITING_PERSISTS` wait at
  a time, beyond which no further request is read until one is answered (the
  client's sends stall under HTTP/2 flow control: backpressure, no memory);
* **authorisation** -- the caller's principal is read once from the stream's
  metadata (the interceptor has already refused a missing or wrong token);
  the first request's log id binds the stream, checked against the job that
  owns the log like a unary call (:func:`~dstl_server.auth.check_job`, admin
  refused); every later request must name the same log or none;
* **errors** -- a request refused with a :class:`DstlError` is answered with
  its kind, status code name and message (counted like a unary refusal) and
  the stream goes on; once a request that carried changes is refused, every
  later request is refused with :class:`WriterFailed` (as the unary session
  is), so no later persist of the stream returns a handle that misses them.
  Bytes that do not decode, and internal errors, end the stream with their
  status (the client fails the requests it has in flight);
* **memory** -- the stream reads its next request only when the node's
  memory budget has room for it (a turn:
  :meth:`~dstl_server.throttle.MemoryBudget.wait_read_turn`); meanwhile
  the request stays on the client under HTTP/2 flow control, costing the
  sidecar nothing. A request that carries changes is admitted into the
  budget before it runs
  (:meth:`~dstl_server.throttle.MemoryBudget.admitted`); when the budget
  is full anyway (the wait ran out, or the request came on a read started
  while there was room) it is refused with :class:`BudgetFull` (left
  undecoded; nothing applied, nothing held), and so is every later request
  of the stream, whatever it carries, so that none is applied before it:
  the client sends the refused request and those after it again, in
  order, on a new stream after a pause. A writer pushed back past
  ``backpressure_timeout_s`` (waiting to be read included) gets
  :class:`Backpressure` (a refusal that fails the stream, as above);
* **idle** -- a stream whose first request does not come within
  ``session_bind_timeout_s`` is ended with ``DEADLINE_EXCEEDED`` (an open
  stream that never names a writer holds memory and a slot of
  ``max_concurrent_rpcs`` for nothing).

Draining: each request counts as a call in flight while it runs (an idle
stream does not hold a shutdown up); after ``stop_accepting`` requests are
answered with :class:`ShuttingDown`. Event-loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import grpc

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
from dstl_server.parts import charge_of
from dstl_server.throttle import READ_TURN_S, ReadTurn

log = logging.getLogger(__name__)

#: persists of one stream waiting for their handles at most; the stream reads
#: no further request while this many wait
MAX_WAITING_PERSISTS = 16


class SessionHandler:
    """The ``Session`` method of the Changelog service: one :class:`SessionStream` per
    stream, through the call lifecycle (``app`` registers it beside the service's
    methods). Event-loop only."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    # the reader/writer form of a streaming handler: answers go out by context.write
    async def Session(
        self, requests: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """One writer's calls on one stream, in stream order (see the module docs)."""
        try:
            if not self.calls.accepting:
                raise ShuttingDown("the sidecar is shutting down")
            await SessionStream(self.calls, context).run()
        except Exception as exc:  # bytes that do not decode, a bug: the stream ends
            await self.calls.abort(context, exc)


class SessionStream:
    """One ``Session`` stream of one writer (see the module docs)."""

    __slots__ = (
        "_calls",
        "_ctx",
        "_expected",
        "_full",
        "_lost",
        "_persists",
        "_principal",
        "_registry",
        "_slots",
        "_write_lock",
        "log_id",
    )

    def __init__(self, calls: Calls, context: grpc.aio.ServicerContext) -> None:
        self._calls = calls
        self._registry = calls.registry
        self._ctx = context
        self._principal = calls.principal(context)
        self.log_id = ""
        #: set once a request that carried changes was refused
        self._lost: DstlError | None = None
        #: set once a request was refused for a full budget: later ones are too
        self._full: BudgetFull | None = None
        #: the charge of the stream's last request with changes: the room its next read
        #: holds (0: none yet, the first read holds the whole budget)
        self._expected = 0
        self._write_lock = asyncio.Lock()
        self._persists: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_WAITING_PERSISTS)

    async def run(self) -> None:
        """Serve requests until the client half-closes; then answer the waiting persists."""
        handle = self._handle
        eof = grpc.aio.EOF
        call_soon = asyncio.get_running_loop().call_soon
        try:
            while True:
                req, turn = await self._next()
                if req is eof:
                    turn.done()
                    break
                # the room held for this read is given back once the request is
                # admitted: after the synchronous start of its handling, which admits it
                call_soon(turn.done)
                try:
                    if type(req) is Unread:
                        await self._refuse_unread(req)
                    else:
                        if type(req) is not pb.SessionRequest:
                            check_decoded(req)  # bytes that do not decode: the stream ends
                        await handle(req)
                finally:
                    # an idle stream must not keep its last request (its changes) alive
                    # while it waits for the next one
                    req = None
            while self._persists:
                await asyncio.wait(set(self._persists))
        finally:
            for task in self._persists:
                task.cancel()
            if self._persists:
                await asyncio.wait(set(self._persists))

    async def _next(self) -> tuple[Any, ReadTurn]:
        """The next request, read once the memory budget lets this stream read (its turn).

        A request in memory costs its bytes whatever is done with it next, so
        the stream reads only when the budget has room for the request it
        expects (as large as its last one with changes; its first: the budget)
        (:meth:`~dstl_server.throttle.MemoryBudget.wait_read_turn`; meanwhile
        HTTP/2 flow control holds the request on the client), or once its
        writer has been pushed back for ``backpressure_timeout_s``. A request
        that came long after the wait ended (the stream was idle) does not
        count as pushed back.
        """
        budget = self._registry.budget
        loop = asyncio.get_running_loop()
        expected = self._expected or budget.limit
        turn = budget.read_turn_now(expected)
        waited = turn is None
        if turn is None:
            self._calls.metrics.backpressure_waits.inc()
            turn = await budget.wait_read_turn(self.log_id, expected)
        started = loop.time()
        try:
            if self.log_id:
                req = await self._ctx.read()
            else:  # not bound yet: the first request must come in time
                req = await self._first_request()
        except BaseException:
            turn.done()
            raise
        if waited and self.log_id and loop.time() - started > READ_TURN_S:
            budget.forget(self.log_id)  # it came later: the writer was idle, not pushed back
        return req, turn

    async def _first_request(self) -> object:
        bind_timeout = self._registry.settings.session_bind_timeout_s
        try:
            return await asyncio.wait_for(self._ctx.read(), bind_timeout)
        except TimeoutError:
            self._calls.metrics.errors.labels("session_idle").inc()
            await self._ctx.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no request named a writer within {bind_timeout:g}s "
                "(session_bind_timeout_s): the stream is closed",
            )
            raise  # unreachable: abort raises

    # ------------------------------------------------------------ requests
    def _bind(self, log_id: str) -> str:
        """The stream's log; the first request binds it, if the caller's job owns it."""
        if self.log_id:
            if log_id and log_id != self.log_id:
                raise InvalidArgument(
                    f"this stream is bound to writer {self.log_id}; a request named "
                    f"{log_id[:64]!r} (open one stream per writer)"
                )
            return self.log_id
        if not log_id:
            raise InvalidArgument("the first request of a Session stream must name its log id")
        self._calls.owned_log(self._principal, log_id, admin_ok=False)
        self.log_id = log_id
        return log_id

    async def _handle(self, req: pb.SessionRequest) -> None:
        rid = req.id
        which = req.WhichOneof("call")
        calls = self._calls
        try:
            calls.enter()
        except ShuttingDown as exc:
            await self._refuse(rid, exc)
            return
        handed_over = False
        carries = False
        try:
            if self._full is not None:
                raise self._full  # not applied before the refused request it follows
            if which == "append":
                carries = True
                call = req.append
                log_id = self._bind(call.log_id)
                self._check_lost()
                with self._admitted(log_id, call.changes):
                    sqn = await self._registry.append(log_id, call.changes)
                await self._send(pb.SessionResponse(id=rid, sqn=sqn))
            elif which == "persist":
                persist = req.persist
                carries = len(persist.changes) > 0
                log_id = self._bind(persist.log_id)
                self._check_lost()
                await self._slots.acquire()
                try:
                    with self._admitted(log_id, persist.changes):
                        pending = await self._registry.begin_persist(
                            log_id, persist.after, persist.changes
                        )
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
                log_id = self._bind(req.last_appended_sqn.log_id)
                self._check_lost()
                sqn = await self._registry.last_appended_sqn(log_id)
                await self._send(pb.SessionResponse(id=rid, sqn=sqn))
            elif which == "truncate":
                log_id = self._bind(req.truncate.log_id)
                self._check_lost()
                await self._registry.truncate(log_id, req.truncate.before)
                await self._send(pb.SessionResponse(id=rid))
            else:
                # an empty call, or one this sidecar does not know: it may have
                # carried changes, so later requests must not apply over it
                carries = True
                raise InvalidArgument(f"request {rid} of the Session stream names no known call")
        except DstlError as exc:
            await self._refusal(rid, exc, carries)
        finally:
            if not handed_over:
                calls.leave()

    async def _refuse_unread(self, unread: Unread) -> None:
        """A request with changes received while the budget had no room (left undecoded):
        refused like a decoded one the budget has no room for, or handled if room came."""
        header = unread.header
        rid = header.request_id
        calls = self._calls
        try:
            calls.enter()
        except ShuttingDown as exc:
            await self._refuse(rid, exc)
            return
        try:
            if self._full is not None:
                raise self._full
            log_id = self._bind(header.log_id)
            self._check_lost()
            if not self._registry.budget.has_room:
                self._check_room(log_id)  # raises
        except DstlError as exc:
            unread.drop()
            await self._refusal(rid, exc, carries=True)
            return
        finally:
            calls.leave()
        req = unread.decode()  # room after all: decoded and handled as usual
        if type(req) is not pb.SessionRequest:
            check_decoded(req)
        await self._handle(req)

    async def _refusal(self, rid: int, exc: DstlError, carries: bool) -> None:
        """Answer request ``rid`` with ``exc``; what later requests of the stream get then."""
        if isinstance(exc, BudgetFull):  # nothing applied: neither this request nor later ones
            if self._full is None:
                self._full = BudgetFull(
                    f"request {rid} of this stream was refused ({exc.message}); later "
                    "requests are refused until it is sent again, on a new stream"
                )
        elif carries and self._lost is None and not isinstance(exc, WriterFailed):
            self._lost = WriterFailed(
                f"request {rid} of writer {self.log_id or '?'}'s stream carried changes "
                f"and was refused ({exc.kind}: {exc.message}); later requests are refused "
                "so that no handle misses them: recreate the writer and recover from the "
                "last checkpoint"
            )
            self._calls.metrics.sessions_failed.inc()
        await self._refuse(rid, exc)

    def _check_lost(self) -> None:
        if self._lost is not None:
            raise self._lost

    def _admitted(
        self, log_id: str, parts: Sequence[pb.KeyGroupChanges]
    ) -> AbstractContextManager[None]:
        """The budget's hold of a request's changes while it runs (none for no changes)."""
        if not parts:
            return contextlib.nullcontext()
        self._check_room(log_id)
        self._expected = charge = charge_of(parts)
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
                out = self._calls.session_persist_answer(rid, handle, pending.after)
            except Exception as exc:  # typed, or a bug (logged; the client sees "internal")
                out = self._calls.stream_error(rid, exc)
            try:
                await self._send(out)
            except Exception as exc:  # the stream ended meanwhile: nobody to answer
                log.info(
                    "persist not answered: %r",
                    exc,
                    extra={"log_id": self.log_id, "request_id": rid},
                )
        finally:
            self._slots.release()
            self._calls.leave()

    # ------------------------------------------------------------ answers
    async def _refuse(self, rid: int, exc: DstlError) -> None:
        """Answer request ``rid`` with ``exc`` (counted like a unary refusal)."""
        await self._send(self._calls.stream_error(rid, exc))

    async def _send(self, response: pb.SessionResponse) -> None:
        # one message in flight per call (gRPC core); persists answer from tasks
        async with self._write_lock:
            await self._ctx.write(response)
