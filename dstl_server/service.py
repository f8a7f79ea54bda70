"""The ``dstl.v1.Changelog`` gRPC service: protobuf in, registry calls, protobuf out.

Errors are mapped to gRPC status codes here and only here: a
:class:`~dstl_client.core.errors.DstlError` becomes its ``grpc_code`` with its
message, and its ``kind`` travels in the ``dstl-error-kind`` trailer so the
client raises the same class. Anything else is logged and becomes INTERNAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import (
    Backpressure,
    DstlError,
    InvalidArgument,
    PermissionDenied,
    ShuttingDown,
    WriterFailed,
)
from dstl_client.core.format import MAX_PARTS_PER_REQUEST, PackedChanges
from dstl_client.core.handle import ChangelogHandle
from dstl_client.core.keys import check_job_id, check_key_of_job
from dstl_client.core.reader import HandleReader
from dstl_server.auth import Authenticator, Principal, check_job
from dstl_server.log import WriterLog
from dstl_server.metrics import ServerMetrics
from dstl_server.registry import LogRegistry
from dstl_server.storage.base import BlobStore

log = logging.getLogger(__name__)

ERROR_KIND_KEY = "dstl-error-kind"
_MAX_DISCARD = 10_000

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
    """What the safe deserializer hands a handler for bytes that do not decode."""

    reason: str


def _check_decoded(request: object) -> None:
    if isinstance(request, _Malformed):
        raise InvalidArgument(request.reason)


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
            _check_decoded(req)
            return await fn(self, req, ctx)
        except Exception as exc:
            await _abort(ctx, exc, self.metrics)
            raise  # unreachable: abort raises
        finally:
            self._leave()

    return wrapper


class ChangelogService(pb_grpc.ChangelogServicer):
    """gRPC adapter over one :class:`LogRegistry` and its blob store.

    Every call is first authorised against the job that *owns* what it names
    (the writer of a log id, the job of a handle, the prefix of an object
    key; see :mod:`dstl_server.auth`), then a writer's ordered calls run in
    client order. A call carrying changes that is refused after it entered
    the order fails its session (:class:`WriterFailed` for every later
    call), so no later persist can return a handle that misses them.
    Event-loop only.
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
        self._accepting = True
        self._in_flight = 0
        #: bytes of change-carrying calls waiting for an earlier call of their writer
        self._parked_bytes = 0
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

    @contextlib.asynccontextmanager
    async def _in_order(
        self,
        wl: WriterLog,
        session: int,
        seq: int,
        changes: Sequence[pb.KeyGroupChanges] = (),
    ) -> AsyncIterator[None]:
        """Run the ordered part of a writer's call after its earlier calls.

        A call that has to wait for an earlier one holds its request in
        memory before the budget sees it; those parked bytes are bounded by
        ``max_in_flight_bytes`` over the node (a client keeps at most a few
        calls of a writer in flight), past which the call is refused with
        Backpressure and, as it carried changes, its session fails.
        """
        calls = wl.calls
        parked = 0
        expected = calls.next_seq if session == calls.session else 1
        if changes and seq and seq != expected and len(changes) <= MAX_PARTS_PER_REQUEST:
            parked = sum(len(c.sizes) + len(c.payload) for c in changes)
            limit = self.registry.settings.max_in_flight_bytes
            if self._parked_bytes + parked > limit:
                refusal = Backpressure(
                    f"call {seq} of writer {wl.log_id} must wait for an earlier call, and "
                    f"waiting calls already hold {self._parked_bytes} bytes (limit {limit})"
                )
                calls.fail(session, WriterFailed(refusal.message))
                self.metrics.sessions_failed.inc()
                raise refusal
            self._parked_bytes += parked
            self.metrics.parked_bytes.set(self._parked_bytes)
        try:
            await calls.enter(session, seq, self.registry.settings.call_order_timeout_s)
        finally:
            if parked:
                self._parked_bytes -= parked
                self.metrics.parked_bytes.set(self._parked_bytes)
        try:
            yield
        finally:
            calls.leave(session, seq)

    async def _append_or_fail(
        self,
        wl: WriterLog,
        changes: Sequence[pb.KeyGroupChanges],
        session: int,
        seq: int,
    ) -> int:
        """Append a call's changes; if they are refused, fail the writer's session."""
        try:
            if len(changes) > MAX_PARTS_PER_REQUEST:
                raise InvalidArgument(
                    f"{len(changes)} key-group parts in one request (at most "
                    f"{MAX_PARTS_PER_REQUEST}): send the buffer in several requests"
                )
            return await self.registry.append(wl.log_id, _batches(changes))
        except BaseException as exc:
            if seq and any(c.count for c in changes):
                why = f"{exc.kind}: {exc.message}" if isinstance(exc, DstlError) else repr(exc)
                wl.calls.fail(
                    session,
                    WriterFailed(
                        f"call {seq} of writer {wl.log_id} carried changes and was refused "
                        f"({why}); later calls are refused so that no handle misses them: "
                        "recreate the writer and recover from the last checkpoint"
                    ),
                )
                self.metrics.sessions_failed.inc()
            raise

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
        wl = self._owned_log(context, request.log_id)
        # Validation runs inside the ordered part, so a refused call still
        # takes its turn and never leaves a gap in the writer's sequence.
        async with self._in_order(wl, request.session, request.seq, request.changes):
            if not request.changes:
                raise InvalidArgument("empty append batch")
            sqn = await self._append_or_fail(wl, request.changes, request.session, request.seq)
        return pb.AppendResponse(sqn=sqn)

    @_unary
    async def LastAppendedSqn(
        self, request: pb.LastAppendedSqnRequest, context: grpc.aio.ServicerContext
    ) -> pb.SqnResponse:
        wl = self._owned_log(context, request.log_id)
        async with self._in_order(wl, request.session, request.seq):
            sqn = self.registry.last_appended_sqn(request.log_id)
        return pb.SqnResponse(sqn=sqn)

    @_unary
    async def PersistDurably(
        self, request: pb.PersistRequest, context: grpc.aio.ServicerContext
    ) -> pb.PersistResponse:
        wl = self._owned_log(context, request.log_id)
        async with self._in_order(wl, request.session, request.seq, request.changes):
            if request.changes:
                await self._append_or_fail(wl, request.changes, request.session, request.seq)
            pending = self.registry.begin_persist(request.log_id, request.after)
        # Later calls of the writer may go on while the uploads run.
        handle = await self.registry.finish_persist(pending)
        return pb.PersistResponse(handle=handle.to_proto())

    @_unary
    async def Truncate(
        self, request: pb.TruncateRequest, context: grpc.aio.ServicerContext
    ) -> pb.TruncateResponse:
        wl = self._owned_log(context, request.log_id)
        async with self._in_order(wl, request.session, request.seq):
            self.registry.truncate(request.log_id, request.before)
        return pb.TruncateResponse()

    @_unary
    async def CloseWriter(
        self, request: pb.CloseWriterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseWriterResponse:
        self._owned_log(context, request.log_id, admin_ok=True)
        self.registry.close_writer(request.log_id)
        return pb.CloseWriterResponse()

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
            handle = ChangelogHandle.from_proto(request.handle)
            check_job_id(handle.job_id)
            check_job(principal, handle.job_id)
            for key in handle.object_keys:
                check_key_of_job(handle.job_id, key)
            key_groups = list(request.key_groups) or None
            async for view in self.reader.read(handle, key_groups):
                yield pb.ReadChangesResponse(
                    key_group=view.key_group,
                    sqn=view.sqn,
                    count=view.count,
                    sizes=view.sizes,
                    payload=view.payload,
                )
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
        keys = list(request.object_keys)
        if len(keys) > _MAX_DISCARD:
            raise InvalidArgument(f"at most {_MAX_DISCARD} keys per call")
        for key in keys:
            check_key_of_job(request.job_id, key)
        deleted = await self.store.delete(keys) if keys else 0
        self.metrics.discarded_objects.inc(deleted)
        return pb.DiscardObjectsResponse(deleted=deleted)


def _batches(changes: Iterable[pb.KeyGroupChanges]) -> list[tuple[int, PackedChanges]]:
    return [(c.key_group, PackedChanges(c.count, c.sizes, c.payload)) for c in changes]


def _safe_deserializer(cls: Any) -> Callable[[bytes], Any]:
    """Parse a request; bytes that do not decode become a :class:`_Malformed` marker.

    gRPC answers a deserializer exception with UNKNOWN; the handler turns the
    marker into INVALID_ARGUMENT with the reason instead.
    """

    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return _Malformed(f"request bytes do not decode as {cls.__name__}: {exc}")

    return parse


def register(server: grpc.aio.Server, service: ChangelogService) -> None:
    """Add the Changelog service to ``server`` with request-decoding errors typed."""
    desc = pb.DESCRIPTOR.services_by_name["Changelog"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in desc.methods:
        req_cls = getattr(pb, method.input_type.name)
        resp_cls = getattr(pb, method.output_type.name)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(service, method.name),
            request_deserializer=_safe_deserializer(req_cls),
            response_serializer=resp_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(desc.full_name, handlers),)
    )
