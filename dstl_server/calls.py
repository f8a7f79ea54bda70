"""One lifecycle for every ``dstl.v1.Changelog`` call, unary or on a stream.

A call (unary, a ``ReadChanges`` stream, each request of a ``Session`` stream)
goes through the same steps, each owned here:

* **bounds** -- a method's request bytes are checked before anything is decoded
  (:func:`register` applies the bounds :mod:`dstl_server.request_bounds` owns);
  refused or undecodable bytes reach the handler as a :class:`Malformed`
  (:func:`check_decoded` raises its error); a writer call with changes that
  arrives while the memory budget is full stays undecoded (:class:`Unread`)
  until :meth:`Calls.admit_unread` decides;
* **gate** -- a call is in flight while it runs; after
  :meth:`Calls.stop_accepting` new calls get :class:`ShuttingDown`;
* **principal** -- the caller from the call's metadata (:meth:`Calls.principal`),
  resolved before a unary handler runs and handed to it (the registry checks it
  against the job owning the writer a call names: ``LogRegistry.owned``);
* **answer** -- an error is mapped once (:meth:`Calls.answer`: counted; a
  :class:`DstlError` keeps its code, kind and bounded message; anything else is
  logged, INTERNAL) and rendered one of two ways: a unary call (or a stream that
  ends) aborts with the status and the ``dstl-error-kind`` trailer
  (:meth:`Calls.abort`); a Session request gets a ``SessionError`` and the
  stream goes on (:meth:`Calls.stream_error`).

Event-loop only (the deserializers run on the server's loop too).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    ERROR_KIND_KEY,
    DstlError,
    InvalidArgument,
    PermissionDenied,
    ShuttingDown,
)
from dstl_server.auth import Authenticator, Principal
from dstl_server.metrics import ServerMetrics
from dstl_server.registry import LogRegistry
from dstl_server.request_bounds import CallHeader, call_header, check_request, method_limits
from dstl_server.throttle import MemoryBudget

log = logging.getLogger(__name__)

#: error messages are cut to this many characters: they travel in metadata
#: (gRPC's limit is 16 KiB) and may quote what a caller sent
MAX_ERROR_MESSAGE_CHARS = 2000
#: writer calls with parts and a turn: their log id (1), session (14) and seq (15)
#: are LastAppendedSqnRequest's fields
_ORDERED_CALLS = frozenset({"Append", "PersistDurably"})


def status_of(exc: DstlError) -> grpc.StatusCode:
    """The status of ``exc``'s ``grpc_code`` (INTERNAL for an unknown name)."""
    return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.INTERNAL)  # type: ignore[no-any-return]


def bounded_message(message: str) -> str:
    """``message``, cut to :data:`MAX_ERROR_MESSAGE_CHARS`."""
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    return message[: MAX_ERROR_MESSAGE_CHARS - 16] + " ...(truncated)"


@dataclass(frozen=True, slots=True)
class Answer:
    """What a refused call is answered, however rendered. ``typed``: a :class:`DstlError`
    (its kind in a unary answer's trailer), else internal (no trailer)."""

    status: grpc.StatusCode
    code: str
    kind: str
    message: str
    typed: bool


@dataclass(frozen=True, slots=True)
class Malformed:
    """What the safe deserializer hands a handler for bytes it refused: undecodable
    (:class:`InvalidArgument`) or out of the method's bounds (:mod:`~dstl_server.request_bounds`)."""

    error: DstlError
    #: a writer call's log id, session and seq, read without its parts (the call still
    #: takes its turn: see :meth:`Calls.refused_writer_call`)
    header: pb.LastAppendedSqnRequest | None = None


def check_decoded(request: object) -> None:
    """Raise the error of a request whose bytes were refused (a :class:`Malformed`)."""
    if isinstance(request, Malformed):
        raise request.error


class Unread:
    """A call with changes received while the memory budget had no room: left undecoded
    (that would copy every change again) until its handler has checked the caller and
    the budget once more (see :func:`safe_deserializer`)."""

    __slots__ = ("_parse", "data", "header")

    def __init__(self, parse: Callable[[bytes], Any], data: bytes, header: CallHeader) -> None:
        self._parse = parse
        self.data = data
        self.header = header

    def decode(self) -> Any:
        """The request, decoded now (the budget has room after all), or a :class:`Malformed`."""
        data, self.data = self.data, b""
        return self._parse(data)

    def drop(self) -> None:  # it was refused: its bytes go
        self.data = b""


class Calls:
    """The lifecycle every Changelog call of one server goes through (see the module docs).

    Invariant: ``in_flight`` is the number of calls (and Session requests)
    between :meth:`enter` and :meth:`leave`; the idle event is set exactly
    when it is 0. ``max_response_bytes`` is what a response message may
    carry in sizes and payload (the message limit less
    ``RESPONSE_MARGIN_BYTES``, the registry's). Event-loop only.
    """

    def __init__(
        self, registry: LogRegistry, metrics: ServerMetrics, auth: Authenticator | None = None
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.auth = auth
        #: sizes + payload per response message (the rest: header fields)
        self.max_response_bytes = registry.max_response_bytes
        #: False once draining (:meth:`stop_accepting`)
        self.accepting = True
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------ gate
    def enter(self) -> None:
        """Count a call in flight, or refuse it with ShuttingDown once draining."""
        if not self.accepting:
            raise ShuttingDown("the sidecar is shutting down")
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def stop_accepting(self) -> None:
        """Refuse new calls with ShuttingDown; running ones go on."""
        self.accepting = False

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no Changelog call is running; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    # ------------------------------------------------------------ principal
    def principal(self, ctx: grpc.aio.ServicerContext) -> Principal | None:
        if self.auth is None:
            return None
        return self.auth.from_metadata(ctx.invocation_metadata())

    # ------------------------------------------------------------ refused bytes
    async def refused_writer_call(
        self, header: pb.LastAppendedSqnRequest, error: DstlError, ctx: grpc.aio.ServicerContext
    ) -> None:
        """An ordered writer call refused before decoding still takes its turn (raises).

        Its log, session and seq were read without its parts; refused in its turn, it
        leaves no gap (no later call waits for it) and fails its session, as it may
        have carried changes.
        """
        self.registry.owned(self.principal(ctx), header.log_id)
        await self.registry.refuse(header.log_id, error, session=header.session, seq=header.seq)

    def admit_unread(self, unread: Unread, ctx: grpc.aio.ServicerContext) -> Any:
        """A unary writer call received while the budget was full: refused as the budget
        refuses it (no turn taken; a writer pushed back too long fails its session),
        else, if room came meanwhile, decoded for its handler (which admits it)."""
        header = unread.header
        try:
            wl = self.registry.owned(self.principal(ctx), header.log_id)
            self.registry.order.check_room(wl, header.session, header.seq)
        except BaseException:
            unread.drop()  # the refusal's traceback may keep this frame for a while
            raise
        return unread.decode()

    # ------------------------------------------------------------ answers
    def answer(self, exc: BaseException) -> Answer:
        """The one mapping of an error to its answer, counted (an internal one logged)."""
        metrics = self.metrics
        if isinstance(exc, DstlError):
            metrics.errors.labels(exc.kind).inc()
            if isinstance(exc, PermissionDenied):
                metrics.auth_refusals.labels(exc.kind).inc()
            return Answer(
                status_of(exc), exc.grpc_code, exc.kind, bounded_message(exc.message), True
            )
        metrics.errors.labels("internal").inc()
        log.exception("internal error", exc_info=exc)
        return Answer(
            grpc.StatusCode.INTERNAL, "INTERNAL", "internal", f"internal error: {exc!r}", False
        )

    async def abort(self, ctx: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
        """End the call with ``exc``'s answer: its status, message and kind trailer."""
        a = self.answer(exc)
        trailers = ((ERROR_KIND_KEY, a.kind),) if a.typed else ()
        await ctx.abort(a.status, a.message, trailing_metadata=trailers)
        raise AssertionError("unreachable: abort raises")

    def stream_error(self, rid: int, exc: BaseException) -> pb.SessionResponse:
        """The answer refusing request ``rid`` of a Session stream with ``exc``."""
        a = self.answer(exc)
        return pb.SessionResponse(
            id=rid, error=pb.SessionError(kind=a.kind, code=a.code, message=a.message)
        )


class Served(Protocol):
    """A servicer whose unary handlers run through :func:`unary`."""

    calls: Calls


S = TypeVar("S", bound=Served)
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def unary(
    fn: Callable[[S, Req, grpc.aio.ServicerContext, Principal | None], Awaitable[Resp]],
) -> Callable[[S, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    """The lifecycle of a unary call around its handler ``fn``: gate, refused or unread
    bytes, decode check, the caller's principal (handed to ``fn``), and every error
    answered once (:meth:`Calls.abort`)."""

    @functools.wraps(fn)
    async def wrapper(self: S, req: Req, ctx: grpc.aio.ServicerContext) -> Resp:
        calls = self.calls
        try:
            calls.enter()
        except ShuttingDown as exc:
            await calls.abort(ctx, exc)
        try:
            if isinstance(req, Unread):
                req = calls.admit_unread(req, ctx)
            if isinstance(req, Malformed) and req.header is not None:
                await calls.refused_writer_call(req.header, req.error, ctx)
            check_decoded(req)
            return await fn(self, req, ctx, calls.principal(ctx))
        except Exception as exc:
            await calls.abort(ctx, exc)
        finally:
            calls.leave()

    return wrapper


def safe_deserializer(
    cls: Any, method: str, limit: int, budget: MemoryBudget | None = None
) -> Callable[[bytes], Any]:
    """Parse a request within its method's bounds; refused bytes become a :class:`Malformed`.

    The bounds (``limit`` bytes, the method's list lengths) are checked on the wire bytes
    before anything is decoded (:func:`check_request`); the handler turns the marker into
    the error's own status (gRPC would answer a deserializer exception with UNKNOWN). With
    ``budget``: a writer call with changes while the budget has no room is not decoded (an
    :class:`Unread`, read from its header): it is refused with ``BudgetFull`` without a
    second copy, its bytes freed as soon as the refusal is sent.
    """

    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return Malformed(
                InvalidArgument(f"request bytes do not decode as {cls.__name__}: {exc}")
            )

    def parse(data: bytes) -> Any:
        try:
            check_request(method, data, limit)
        except DstlError as exc:
            if method not in _ORDERED_CALLS:
                return Malformed(exc)
            try:  # its log, session and seq: the parts are an unknown field here, raw bytes
                header = pb.LastAppendedSqnRequest.FromString(data)
            except DecodeError:
                return Malformed(exc)
            return Malformed(exc, header)
        if budget is not None and not budget.has_room:
            unread = call_header(method, data)
            if unread is not None and unread.changes:
                return Unread(decode, data, unread)
        return decode(data)

    return parse


def register(
    server: grpc.aio.Server,
    calls: Calls,
    service: object,
    streams: object,
) -> None:
    """Add the Changelog service to ``server``: ``streams`` serves ``Session`` and ``Mux``,
    ``service`` every other method (by name); requests bounded before decoding, errors typed."""
    desc = pb.DESCRIPTOR.services_by_name["Changelog"]
    settings = calls.registry.settings
    budget = calls.registry.budget
    limits = method_limits(
        [m.name for m in desc.methods],
        max_request=settings.max_request_bytes,
        max_read=settings.max_read_request_bytes,
        max_control=settings.max_control_request_bytes,
    )
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in desc.methods:
        req_cls = getattr(pb, method.input_type.name)
        resp_cls = getattr(pb, method.output_type.name)
        make = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        handler = getattr(streams if method.name in ("Session", "Mux") else service, method.name)
        handlers[method.name] = make(
            handler,
            request_deserializer=safe_deserializer(
                req_cls, method.name, limits[method.name], budget
            ),
            response_serializer=resp_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(desc.full_name, handlers),)
    )
