"""Writer streams: ``Mux`` (every writer of a client process) and ``Session`` (one writer).

A unary call costs the sidecar a new HTTP/2 stream, its metadata and the
authentication interceptor every time; on an open stream a request is a
part of a message, and on a ``Mux`` stream one message carries the requests
of several writers that were ready together. :class:`WriterStream` serves
one stream of either kind; everything per writer (order, binding, sticky
failure, the memory refusals, waiting persists) is its
:class:`~dstl_server.session_lane.WriterLane`'s, so a writer's refusal never
reaches the other writers of a ``Mux`` stream. Per stream:

* **order** -- messages are read one at a time and each request's ordered
  part runs before the next request is handled, so each writer's order on
  the stream is its call order;
* **lanes** -- a ``Session`` stream has one lane, bound by its first request;
  on a ``Mux`` stream every request names its writer (its log id) and gets
  that writer's lane, made at its first request once the caller's job was
  checked against the log's (another job's writer: ``PermissionDenied`` for
  that request, the stream goes on). At most :data:`MAX_LANES` per stream:
  lanes with nothing sticky or waiting make room for new ones;
* **authorisation** -- the caller's principal is read once from the
  stream's metadata (the interceptor has already refused a missing or wrong
  token) and applies to every writer of the stream;
* **answers** -- lanes hand their answers to the stream's
  :class:`~dstl_server.session_outbox.Outbox`, whose task writes them (on a
  ``Mux`` stream those ready together in one message: every persist
  completed by one flush); the stream reads no further message while it
  holds :data:`~dstl_server.session_outbox.MAX_QUEUED_ANSWERS`;
* **memory** -- the stream reads its next message only when the node's
  memory budget has room for it (a turn:
  :meth:`~dstl_server.throttle.MemoryBudget.wait_read_turn`, expecting as
  much as the last message with changes took); meanwhile the message stays
  on the client under HTTP/2 flow control. A ``Session`` request received
  while the budget was full is left undecoded
  (:class:`~dstl_server.calls.Unread`); a ``Mux`` message is decoded (its
  bytes are bounded by ``max_request_bytes``) and each of its requests with
  changes is refused per lane when the budget is full;
* **errors** -- bytes that do not decode, and internal errors, end the
  stream with their status (the client fails the requests it has in
  flight); a request refused with a :class:`DstlError` is answered and the
  stream goes on;
* **idle** -- a stream whose first message does not come within
  ``session_bind_timeout_s`` is ended with ``DEADLINE_EXCEEDED``.

Draining: each request counts as a call in flight while it runs (an idle
stream does not hold a shutdown up); after ``stop_accepting`` requests are
answered with :class:`ShuttingDown`. Event-loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import DstlError, InvalidArgument, ShuttingDown, TooManyWriters
from dstl_server.calls import Calls, Unread, check_decoded
from dstl_server.session_lane import MAX_WAITING_PERSISTS, WriterLane
from dstl_server.session_outbox import Outbox
from dstl_server.throttle import READ_TURN_S, ReadTurn

__all__ = ["MAX_LANES", "MAX_WAITING_PERSISTS", "SessionHandler", "WriterStream"]

log = logging.getLogger(__name__)

#: writers one Mux stream keeps a lane for at most
MAX_LANES = 4096
#: seconds a stream ending on an error gives its queued answers to leave first
_FLUSH_ON_ERROR_S = 5.0


class SessionHandler:
    """The ``Session`` and ``Mux`` methods of the Changelog service: one
    :class:`WriterStream` per stream, through the call lifecycle (``app``
    registers them beside the service's methods). Event-loop only."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    # the reader/writer form of a streaming handler: answers go out by context.write
    async def Session(
        self, requests: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """One writer's calls on one stream, in stream order (see the module docs)."""
        await self._serve(context, mux=False)

    async def Mux(
        self, requests: AsyncIterator[pb.MuxRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """Every writer of a client on one stream, each in its call order (see the module docs)."""
        await self._serve(context, mux=True)

    async def _serve(self, context: grpc.aio.ServicerContext, *, mux: bool) -> None:
        try:
            if not self.calls.accepting:
                raise ShuttingDown("the sidecar is shutting down")
            await WriterStream(self.calls, context, mux=mux).run()
        except Exception as exc:  # bytes that do not decode, a bug: the stream ends
            await self.calls.abort(context, exc)


class WriterStream:
    """One ``Session`` or ``Mux`` stream (see the module docs).

    Invariants: one reader (:meth:`run`) hands requests to lanes one at a
    time; a ``Session`` stream has exactly one lane, a ``Mux`` stream at most
    :data:`MAX_LANES`, one per log id; answers leave only through the outbox.
    """

    __slots__ = (
        "_calls",
        "_ctx",
        "_expected",
        "_in",
        "_in_per_message",
        "_lanes",
        "_mux",
        "_outbox",
        "_principal",
        "_who",
    )

    def __init__(self, calls: Calls, context: grpc.aio.ServicerContext, *, mux: bool) -> None:
        self._calls = calls
        self._ctx = context
        self._mux = mux
        self._principal = calls.principal(context)
        self._outbox = Outbox(context, calls.metrics, mux=mux, max_bytes=calls.max_response_bytes)
        self._lanes: dict[str, WriterLane] = {}
        self._in = calls.metrics.stream_messages.labels("in")
        self._in_per_message = calls.metrics.stream_requests_per_message.labels("in")
        if not mux:  # bound by its first request
            self._lanes[""] = self._new_lane()
        #: who waits for the stream's read turns (a Session stream: its writer, once bound)
        self._who = f"mux-{id(self):x}" if mux else ""
        #: the charge of the stream's last message with changes: the room its next read
        #: holds (0: none yet, the first read holds the whole budget)
        self._expected = 0

    def _new_lane(self) -> WriterLane:
        return WriterLane(self._calls, self._principal, self._outbox, single=not self._mux)

    async def run(self) -> None:
        """Serve messages until the client half-closes; then answer the waiting persists."""
        outbox = self._outbox
        sender = asyncio.get_running_loop().create_task(outbox.run(), name="dstl-stream-answers")
        eof = grpc.aio.EOF
        call_soon = asyncio.get_running_loop().call_soon
        try:
            while True:
                await outbox.room()
                msg, turn = await self._next()
                if msg is eof:
                    turn.done()
                    break
                # the room held for this read is given back once the request is
                # admitted: after the synchronous start of its handling, which admits it
                call_soon(turn.done)
                try:
                    if self._mux:
                        await self._serve_mux(msg)
                    else:
                        await self._serve_session(msg)
                    await outbox.flush()  # the answers given in turn, in one message
                finally:
                    # an idle stream must not keep its last message (its changes) alive
                    # while it waits for the next one
                    msg = None
            for lane in list(self._lanes.values()):
                await lane.wait_persists()
            await outbox.close()
        except Exception:
            with contextlib.suppress(Exception):  # what was answered before still leaves
                await asyncio.wait_for(asyncio.shield(outbox.close()), _FLUSH_ON_ERROR_S)
            raise
        finally:
            for lane in list(self._lanes.values()):
                await lane.cancel_persists()
            sender.cancel()
            await asyncio.wait({sender})

    async def _serve_session(self, req: Any) -> None:
        self._in.inc()
        lane = self._lanes[""]
        if type(req) is Unread:
            await lane.handle_unread(req)
        else:
            if type(req) is not pb.SessionRequest:
                check_decoded(req)  # bytes that do not decode: the stream ends
            await lane.handle(req)
        if lane.charged:
            self._expected, lane.charged = lane.charged, 0
        self._who = lane.log_id

    async def _serve_mux(self, msg: Any) -> None:
        if type(msg) is not pb.MuxRequest:
            check_decoded(msg)  # bytes that do not decode: the stream ends
        self._in.inc()
        self._in_per_message.observe(len(msg.calls))
        charged = 0
        for req in msg.calls:
            lane = self._lane_for(req)
            if lane is None:
                continue  # refused: answered
            await lane.handle(req)
            charged += lane.charged
            lane.charged = 0
        if charged:
            self._expected = charged

    def _lane_for(self, req: pb.SessionRequest) -> WriterLane | None:
        """The lane of the writer ``req`` names (made at its first request, if the
        caller's job owns the log), or None once ``req`` was refused."""
        which = req.WhichOneof("call")
        log_id: str = getattr(req, which).log_id if which else ""
        lane = self._lanes.get(log_id)
        if lane is not None:
            return lane
        try:
            if not log_id:
                raise InvalidArgument(
                    f"request {req.id} of a Mux stream names no writer (every request "
                    "names its log id)"
                )
            if len(self._lanes) >= MAX_LANES:
                self._forget_clean_lanes()
            lane = self._new_lane()
            lane.bind(log_id)  # the caller's job must own the log
        except DstlError as exc:
            self._outbox.put(self._calls.stream_error(req.id, exc))
            return None
        self._lanes[log_id] = lane
        return lane

    def _forget_clean_lanes(self) -> None:
        """Make room for a new lane, or refuse it (TooManyWriters)."""
        for log_id in [k for k, lane in self._lanes.items() if lane.clean]:
            del self._lanes[log_id]
        if len(self._lanes) >= MAX_LANES:
            raise TooManyWriters(
                f"this stream carries {len(self._lanes)} writers with refusals or persists "
                f"pending (at most {MAX_LANES}); open another stream"
            )

    async def _next(self) -> tuple[Any, ReadTurn]:
        """The next message, read once the memory budget lets this stream read (its turn).

        A message in memory costs its bytes whatever is done with it next, so
        the stream reads only when the budget has room for the message it
        expects (as large as its last one with changes; its first: the budget)
        (:meth:`~dstl_server.throttle.MemoryBudget.wait_read_turn`; meanwhile
        HTTP/2 flow control holds it on the client), or once it has been
        pushed back for ``backpressure_timeout_s``. A message that came long
        after the wait ended (the stream was idle) does not count as pushed back.
        """
        budget = self._calls.registry.budget
        loop = asyncio.get_running_loop()
        expected = self._expected or budget.limit
        turn = budget.read_turn_now(expected)
        waited = turn is None
        who = self._who
        if turn is None:
            self._calls.metrics.backpressure_waits.inc()
            turn = await budget.wait_read_turn(who, expected)
        started = loop.time()
        try:
            if self._bound():
                msg = await self._ctx.read()
            else:  # nothing read yet: the first message must come in time
                msg = await self._first_message()
        except BaseException:
            turn.done()
            raise
        if waited and who and loop.time() - started > READ_TURN_S:
            budget.forget(who)  # it came later: the writer was idle, not pushed back
        return msg, turn

    def _bound(self) -> bool:
        """Whether a request has named a writer the caller may use."""
        return bool(self._lanes) if self._mux else bool(self._lanes[""].log_id)

    async def _first_message(self) -> object:
        bind_timeout = self._calls.registry.settings.session_bind_timeout_s
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
