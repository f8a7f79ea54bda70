"""The ``dstl.v1.Changelog`` gRPC service: protobuf in, registry calls, protobuf out.

Errors are mapped to gRPC status codes here and only here: a
:class:`~dstl_client.core.errors.DstlError` becomes its ``grpc_code`` with its
message, and its ``kind`` travels in the ``dstl-error-kind`` trailer so the
client raises the same class. Anything else is logged and becomes INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import (
    DstlError,
    InvalidArgument,
    PermissionDenied,
    ShuttingDown,
    SqnOutOfRange,
)
from dstl_client.core.format import ChangesetView
from dstl_client.core.handle import ChangelogHandle
from dstl_client.core.keys import check_job_id, check_key_of_job, job_prefix
from dstl_client.core.reader import HandleReader
from dstl_server.auth import Authenticator, Principal, check_job, check_node
from dstl_server.log import WriterLog
from dstl_server.metrics import ServerMetrics
from dstl_server.registry import LogRegistry
from dstl_server.request_bounds import (
    MAX_DISCARD_KEYS,
    MAX_READ_KEY_GROUPS,
    CallHeader,
    call_header,
    check_request,
    method_limits,
)
from dstl_server.storage.base import BlobStore, validate_key
from dstl_server.throttle import MemoryBudget

log = logging.getLogger(__name__)

ERROR_KIND_KEY = "dstl-error-kind"
_MAX_LIST_PAGE = 1000  # keys a ListObjects call examines at most (page_size 0 or more)
_LIST_ENTRY_OVERHEAD = 8  # tag and length of one repeated ObjectInfo

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def status_of(exc: DstlError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.INTERNAL)  # type: ignore[no-any-return]


#: error messages are cut to this many characters: they travel in metadata
#: (gRPC's limit is 16 KiB) and may quote what a caller sent
MAX_ERROR_MESSAGE_CHARS = 2000


def _bounded(message: str) -> str:
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    return message[: MAX_ERROR_MESSAGE_CHARS - 16] + " ...(truncated)"


async def _abort(ctx: grpc.aio.ServicerContext, exc: BaseException, metrics: ServerMetrics) -> None:
    if isinstance(exc, DstlError):
        metrics.errors.labels(exc.kind).inc()
        if isinstance(exc, PermissionDenied):
            metrics.auth_refusals.labels(exc.kind).inc()
        await ctx.abort(
            status_of(exc), _bounded(exc.message), trailing_metadata=((ERROR_KIND_KEY, exc.kind),)
        )
    metrics.errors.labels("internal").inc()
    log.exception("internal error", exc_info=exc)
    await ctx.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")


@dataclass(frozen=True, slots=True)
class _Malformed:
    """What the safe deserializer hands a handler for bytes it refused: ones that do not
    decode (:class:`InvalidArgument`) or that are out of the method's bounds
    (:mod:`dstl_server.request_bounds`)."""

    error: DstlError
    #: a writer call's log id, session and seq, read without its parts (the call still
    #: takes its turn: see ``ChangelogService._refused_writer_call``)
    header: pb.LastAppendedSqnRequest | None = None


def _check_decoded(request: object) -> None:
    if isinstance(request, _Malformed):
        raise request.error


class _Unread:
    """A call that carries changes, received while the memory budget had no room: left
    undecoded (decoding would copy every change again) until its handler has checked
    the caller and the budget once more (see :func:`_safe_deserializer`)."""

    __slots__ = ("_parse", "data", "header")

    def __init__(self, parse: Callable[[bytes], Any], data: bytes, header: CallHeader) -> None:
        self._parse = parse
        self.data = data
        self.header = header

    def decode(self) -> Any:
        """The request, decoded now (the budget has room after all), or a :class:`_Malformed`."""
        data, self.data = self.data, b""
        return self._parse(data)

    def drop(self) -> None:
        """Let go of the request's bytes (it was refused)."""
        self.data = b""


def _unary(
    fn: Callable[[ChangelogService, Req, grpc.aio.ServicerContext], Awaitable[Resp]],
) -> Callable[[ChangelogService, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: ChangelogService, req: Req, ctx: grpc.aio.ServicerContext) -> Resp:
        try:
            self._enter()
        except ShuttingDown as exc:
            await _abort(ctx, exc, self.metrics)
            raise
        try:
            if isinstance(req, _Unread):
                req = self._admit_unread(req, ctx)
            if isinstance(req, _Malformed) and req.header is not None:
                await self._refused_writer_call(req.header, req.error, ctx)
            _check_decoded(req)
            return await fn(self, req, ctx)
        except Exception as exc:
            await _abort(ctx, exc, self.metrics)
            raise  # unreachable: abort raises
        finally:
            self._leave()

    return wrapper


#: room left in a ReadChanges message for everything but sizes and payload
RESPONSE_MARGIN_BYTES = 32 << 10
#: a batched ReadChanges message is sent once its changesets reach this many bytes
#: (a larger changeset piece goes alone, up to the message limit)
READ_BATCH_BYTES = 1 << 20
#: upper bound of a Changeset's framing and numbers inside a batched message
_CHANGESET_FIXED_BOUND = 48
#: a caller's max_message_bytes never makes messages carry less than this
MIN_READ_MESSAGE_BYTES = 64 << 10
#: upper bounds of an encoded PersistResponse beyond its strings: the message
#: and handle framing with every number field at its widest (10-byte varints),
#: and per entry its framing and numbers; a string adds at most 4 bytes per
#: character (UTF-8)
_HANDLE_FIXED_BOUND = 128
_ENTRY_FIXED_BOUND = 72


def _changeset_fields(view: ChangesetView) -> dict[str, Any]:
    return {
        "key_group": view.key_group,
        "sqn": view.sqn,
        "count": view.count,
        "sizes": view.sizes,
        "payload": view.payload,
    }


async def _batched_messages(
    changesets: AsyncIterator[ChangesetView], piece_limit: int, batch_limit: int
) -> AsyncIterator[pb.ReadChangesResponse]:
    """``ReadChanges`` answers of several changesets each, in read order.

    A changeset larger than ``piece_limit`` (every append of a key group
    between two persists) goes in pieces of at most that many bytes; a
    message holds changesets up to ``batch_limit`` bytes, framing included,
    or one piece alone.
    """
    batch: list[pb.Changeset] = []
    batch_bytes = 0
    async for changeset in changesets:
        for view in changeset.split(piece_limit):
            size = len(view.sizes) + len(view.payload) + _CHANGESET_FIXED_BOUND
            if batch and batch_bytes + size > batch_limit:
                yield pb.ReadChangesResponse(changesets=batch)
                batch, batch_bytes = [], 0
            batch.append(pb.Changeset(**_changeset_fields(view)))
            batch_bytes += size
    if batch:
        yield pb.ReadChangesResponse(changesets=batch)


class ChangelogService(pb_grpc.ChangelogServicer):
    """gRPC adapter over one :class:`LogRegistry` and its blob store.

    Every call is decoded (undecodable bytes: INVALID_ARGUMENT), authorised
    against the job that *owns* what it names (the writer of a log id, the
    job of a handle, the prefix of an object key; see :mod:`dstl_server.auth`)
    and handed to the registry, which runs a writer's calls in client order
    (with their ``session``/``seq``); the answer is encoded, an error mapped
    to its status once (:func:`_abort`). Draining: after ``stop_accepting``
    new calls get ShuttingDown. Event-loop only.
    """

    def __init__(
        self,
        registry: LogRegistry,
        store: BlobStore,
        metrics: ServerMetrics,
        epoch: str,
        auth: Authenticator | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.epoch = epoch
        self.auth = auth
        self.reader = HandleReader(self._fetch)
        #: sizes + payload per ReadChanges message; the rest of the message limit
        #: is left for the header fields (settings keep 64 KiB free)
        self._max_response_bytes = registry.settings.max_request_bytes - RESPONSE_MARGIN_BYTES
        #: a batched message holds changesets up to this many bytes (framing included)
        self._read_batch_bytes = min(READ_BATCH_BYTES, self._max_response_bytes)
        self._accepting = True
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------ draining
    def _enter(self) -> None:
        if not self._accepting:
            raise ShuttingDown("the sidecar is shutting down")
        self._in_flight += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    # ------------------------------------------------------------ authorisation
    def _principal(self, ctx: grpc.aio.ServicerContext) -> Principal | None:
        if self.auth is None:
            return None
        return self.auth.from_metadata(ctx.invocation_metadata())

    def _owned_log(
        self, ctx: grpc.aio.ServicerContext, log_id: str, *, admin_ok: bool = False
    ) -> WriterLog:
        """The writer ``log_id`` names, if the caller's job owns it."""
        principal = self._principal(ctx)
        wl = self.registry.get(log_id)
        check_job(principal, wl.job_id, admin_ok=admin_ok)
        return wl

    async def _refused_writer_call(
        self, header: pb.LastAppendedSqnRequest, error: DstlError, ctx: grpc.aio.ServicerContext
    ) -> None:
        """An ordered writer call refused before decoding still takes its turn (raises).

        Its log, session and seq were read without its parts; refused in its
        turn, it leaves no gap in the writer's calls (no later call waits for
        it, none is told it was lost) and fails its session, as it may have
        carried changes.
        """
        self._owned_log(ctx, header.log_id)
        await self.registry.refuse(header.log_id, error, session=header.session, seq=header.seq)

    def _admit_unread(self, unread: _Unread, ctx: grpc.aio.ServicerContext) -> Any:
        """A unary writer call received while the budget was full: refused as the budget
        refuses it (no turn taken; a writer pushed back too long fails its session),
        else, if room came meanwhile, decoded for its handler (which admits it)."""
        header = unread.header
        try:
            wl = self._owned_log(ctx, header.log_id)
            self.registry.order.check_room(wl, header.session, header.seq)
        except BaseException:
            unread.drop()  # the refusal's traceback may keep this frame for a while
            raise
        return unread.decode()

    def stop_accepting(self) -> None:
        """Refuse new calls with ShuttingDown; running ones go on."""
        self._accepting = False

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no Changelog call is running; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def _fetch(self, key: str, offset: int, length: int) -> bytes:
        data = await self.store.get(key, offset, length)
        self.metrics.read_bytes.inc(len(data))
        return data

    @_unary
    async def CreateWriter(
        self, request: pb.CreateWriterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateWriterResponse:
        check_job(self._principal(context), request.job_id, admin_ok=False)
        wl = self.registry.create_writer(
            request.job_id, request.operator_id, (request.first_key_group, request.last_key_group)
        )
        return pb.CreateWriterResponse(
            log_id=wl.log_id,
            server_epoch=self.epoch,
            initial_sqn=wl.active_sqn,
            max_change_bytes=self.registry.settings.max_change_bytes,
        )

    @_unary
    async def Append(
        self, request: pb.AppendRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        self._owned_log(context, request.log_id)
        sqn = await self.registry.append(
            request.log_id, request.changes, session=request.session, seq=request.seq
        )
        return pb.AppendResponse(sqn=sqn)

    @_unary
    async def LastAppendedSqn(
        self, request: pb.LastAppendedSqnRequest, context: grpc.aio.ServicerContext
    ) -> pb.SqnResponse:
        self._owned_log(context, request.log_id)
        sqn = await self.registry.last_appended_sqn(
            request.log_id, session=request.session, seq=request.seq
        )
        return pb.SqnResponse(sqn=sqn)

    @_unary
    async def PersistDurably(
        self, request: pb.PersistRequest, context: grpc.aio.ServicerContext
    ) -> pb.PersistResponse:
        self._owned_log(context, request.log_id)
        handle = await self.registry.persist(
            request.log_id,
            request.after,
            request.changes,
            session=request.session,
            seq=request.seq,
        )
        return self.persist_response(handle, request.after)

    def persist_response(self, handle: ChangelogHandle, after: int) -> pb.PersistResponse:
        """The answer to a persist (unary or on a stream), if the handle fits in a message."""
        response = pb.PersistResponse(handle=handle.to_proto())
        if response.ByteSize() > self._max_response_bytes:
            # durable, but the handle cannot travel: say why instead of a bare
            # RESOURCE_EXHAUSTED from the transport
            raise SqnOutOfRange(
                f"the handle from SQN {after} spans {len(handle.entries)} sections, "
                f"{response.ByteSize()} bytes encoded, more than a message may carry "
                f"({self._max_response_bytes}); truncate the log or persist from a later SQN"
            )
        return response

    def session_persist_answer(
        self, rid: int, handle: ChangelogHandle, after: int
    ) -> pb.SessionResponse:
        """A persist's answer on a Session stream: the handle built once, in the answer itself.

        Refused like :meth:`persist_response` when the handle does not fit in a
        message (that check, exact, runs only when a cheap bound says it may not).
        """
        bound = _HANDLE_FIXED_BOUND + 4 * (len(handle.job_id) + len(handle.log_id))
        for e in handle.entries:
            bound += 4 * len(e.object_key) + _ENTRY_FIXED_BOUND
        if bound > self._max_response_bytes:
            self.persist_response(handle, after)  # raises if it really does not fit
        return pb.SessionResponse(id=rid, handle=handle.to_proto())

    @_unary
    async def Truncate(
        self, request: pb.TruncateRequest, context: grpc.aio.ServicerContext
    ) -> pb.TruncateResponse:
        self._owned_log(context, request.log_id)
        await self.registry.truncate(
            request.log_id, request.before, session=request.session, seq=request.seq
        )
        return pb.TruncateResponse()

    @_unary
    async def CloseWriter(
        self, request: pb.CloseWriterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseWriterResponse:
        self._owned_log(context, request.log_id, admin_ok=True)
        self.registry.close_writer(request.log_id)
        return pb.CloseWriterResponse()

    # the reader/writer form of a streaming handler: answers go out by context.write
    async def Session(  # type: ignore[override]
        self, requests: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """One writer's calls on one stream, in stream order (see :mod:`dstl_server.session`)."""
        from dstl_server.session import SessionStream

        try:
            if not self._accepting:
                raise ShuttingDown("the sidecar is shutting down")
            await SessionStream(self, context).run()
        except Exception as exc:  # bytes that do not decode, a bug: the stream ends
            await _abort(context, exc, self.metrics)

    async def ReadChanges(
        self, request: pb.ReadChangesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadChangesResponse]:
        self.metrics.reads.inc()
        try:
            self._enter()
        except ShuttingDown as exc:
            await _abort(context, exc, self.metrics)
            raise
        try:
            _check_decoded(request)
            principal = self._principal(context)
            if principal is not None:  # the caller's job before any entry is built
                check_job(principal, request.handle.job_id)
            handle = ChangelogHandle.from_proto(request.handle)  # entries bounded on the wire
            check_job_id(handle.job_id)
            check_job(principal, handle.job_id)
            for key in handle.object_keys:
                check_key_of_job(handle.job_id, key)
            if len(request.key_groups) > MAX_READ_KEY_GROUPS:
                raise InvalidArgument(f"at most {MAX_READ_KEY_GROUPS} key groups per call")
            key_groups = list(request.key_groups) or None
            piece_limit = self._max_response_bytes
            if request.max_message_bytes:  # the caller's receive limit
                piece_limit = min(
                    piece_limit,
                    max(MIN_READ_MESSAGE_BYTES, request.max_message_bytes - RESPONSE_MARGIN_BYTES),
                )
            views = self.reader.read(handle, key_groups)
            if request.batched:
                batch_limit = min(self._read_batch_bytes, piece_limit)
                async for msg in _batched_messages(views, piece_limit, batch_limit):
                    yield msg
            else:
                async for changeset in views:
                    for view in changeset.split(piece_limit):
                        yield pb.ReadChangesResponse(**_changeset_fields(view))
        except Exception as exc:
            await _abort(context, exc, self.metrics)
        finally:
            self._leave()

    @_unary
    async def DiscardObjects(
        self, request: pb.DiscardObjectsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DiscardObjectsResponse:
        check_job_id(request.job_id)
        check_job(self._principal(context), request.job_id)
        if len(request.object_keys) > MAX_DISCARD_KEYS:  # counted before the list is built
            raise InvalidArgument(f"at most {MAX_DISCARD_KEYS} keys per call")
        keys = list(request.object_keys)
        for key in keys:
            check_key_of_job(request.job_id, key)
        deleted = await self.store.delete(keys) if keys else 0
        self.metrics.discarded_objects.inc(deleted)
        return pb.DiscardObjectsResponse(deleted=deleted)

    @_unary
    async def ListObjects(
        self, request: pb.ListObjectsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListObjectsResponse:
        """One page of the job's objects, in key order.

        Authorised like DiscardObjects: a job token lists only its own job,
        the admin token any. Only keys under the job's prefix that have the
        layout of the job's objects are returned (temp files of writes in
        progress and anything else there are skipped). A call examines at
        most ``page_size`` keys (0 or more than 1000: 1000) and ends before
        it outgrows a message, so a page may hold fewer objects than that
        while more follow; the page token is the last key it covered, and the
        store lists from after it.
        """
        job_id = check_job_id(request.job_id)
        check_job(self._principal(context), job_id)
        self.metrics.list_requests.inc()
        prefix = job_prefix(job_id)
        token = request.page_token
        if token:
            try:
                validate_key(token)
            except InvalidArgument:
                raise InvalidArgument(f"bad page token {token[:200]!r}") from None
            if not token.startswith(prefix):
                raise InvalidArgument(
                    f"page token {token[:200]!r} is not one of job {job_id!r}'s listing"
                )
        page_size = min(request.page_size or _MAX_LIST_PAGE, _MAX_LIST_PAGE)
        objects: list[pb.ObjectInfo] = []
        examined = 0
        encoded = 0  # bytes of the objects so far: a page also ends before outgrowing a message
        full = False
        last = ""
        listing = self.store.list(prefix, start_after=token)
        try:
            async for info in listing:
                examined += 1
                try:
                    check_key_of_job(job_id, info.key)
                except PermissionDenied:
                    pass  # not an object the sidecar wrote for the job: never listed
                else:
                    obj = pb.ObjectInfo(
                        object_key=info.key,
                        size=info.size,
                        modified_unix_ms=max(0, int(info.modified * 1000)),
                    )
                    encoded += obj.ByteSize() + _LIST_ENTRY_OVERHEAD
                    if encoded > self._max_response_bytes and objects:
                        full = True  # listed again from the previous key on the next page
                        break
                    objects.append(obj)
                last = info.key
                if examined >= page_size:
                    full = True
                    break
        finally:
            aclose = getattr(listing, "aclose", None)
            if aclose is not None:
                await aclose()
        return pb.ListObjectsResponse(objects=objects, next_page_token=last if full else "")

    @_unary
    async def Forward(
        self, request: pb.ForwardRequest, context: grpc.aio.ServicerContext
    ) -> pb.ForwardResponse:
        """A child node's flush, answered once the object holding it is complete."""
        check_node(self._principal(context))
        uploads = self.registry.uploads
        entries = await uploads.accept_forwarded(
            request.job_id, list(request.sections), sender=request.sender
        )
        places = [pb.SectionPlacement(offset=e.offset, length=e.length) for e in entries]
        return pb.ForwardResponse(object_key=entries[0].object_key, placements=places)


#: writer calls with parts and a turn: their log id (1), session (14) and seq (15)
#: are LastAppendedSqnRequest's fields
_ORDERED_CALLS = frozenset({"Append", "PersistDurably"})


def _safe_deserializer(
    cls: Any, method: str, limit: int, budget: MemoryBudget | None = None
) -> Callable[[bytes], Any]:
    """Parse a request within its method's bounds; refused bytes become a :class:`_Malformed`.

    The bounds (``limit`` bytes, the method's list lengths) are checked on the
    wire bytes before anything is decoded (:func:`check_request`). gRPC
    answers a deserializer exception with UNKNOWN; the handler turns the
    marker into the error's own status instead. With ``budget``: a writer
    call that carries changes while the budget has no room is not decoded
    at all (an :class:`_Unread`, read from its header on the wire): its
    handler refuses it with ``BudgetFull`` (gRPC has already received it,
    but it is not copied again into a decoded message, and it is freed as
    soon as the refusal is sent).
    """

    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return _Malformed(
                InvalidArgument(f"request bytes do not decode as {cls.__name__}: {exc}")
            )

    def parse(data: bytes) -> Any:
        try:
            check_request(method, data, limit)
        except DstlError as exc:
            if method not in _ORDERED_CALLS:
                return _Malformed(exc)
            try:  # its log, session and seq: the parts are an unknown field here, raw bytes
                header = pb.LastAppendedSqnRequest.FromString(data)
            except DecodeError:
                return _Malformed(exc)
            return _Malformed(exc, header)
        if budget is not None and not budget.has_room:
            unread = call_header(method, data)
            if unread is not None and unread.changes:
                return _Unread(decode, data, unread)
        return decode(data)

    return parse


def register(server: grpc.aio.Server, service: ChangelogService) -> None:
    """Add the Changelog service to ``server``, each method's requests bounded before decoding
    (:mod:`dstl_server.request_bounds`) and their decoding errors typed."""
    desc = pb.DESCRIPTOR.services_by_name["Changelog"]
    settings = service.registry.settings
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
        handlers[method.name] = make(
            getattr(service, method.name),
            request_deserializer=_safe_deserializer(
                req_cls, method.name, limits[method.name], service.registry.budget
            ),
            response_serializer=resp_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(desc.full_name, handlers),)
    )
