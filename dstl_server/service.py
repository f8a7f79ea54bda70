"""The ``dstl.v1.Changelog`` gRPC service: protobuf in, registry calls, protobuf out.

Errors are mapped to gRPC status codes here and only here: a
:class:`~dstl_client.errors.DstlError` becomes its ``grpc_code`` with its
message, and its ``kind`` travels in the ``dstl-error-kind`` trailer so the
client raises the same class. Anything else is logged and becomes INTERNAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc

from dstl_client._pb import dstl_pb2 as pb
from dstl_client._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.errors import DstlError, InvalidArgument, ShuttingDown
from dstl_client.format import PackedChanges
from dstl_client.handle import ChangelogHandle
from dstl_client.reader import HandleReader
from dstl_server.keys import check_job_id, check_key_of_job
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


async def _abort(ctx: grpc.aio.ServicerContext, exc: BaseException, metrics: ServerMetrics) -> None:
    if isinstance(exc, DstlError):
        metrics.errors.labels(exc.kind).inc()
        await ctx.abort(
            status_of(exc), exc.message, trailing_metadata=((ERROR_KIND_KEY, exc.kind),)
        )
    metrics.errors.labels("internal").inc()
    log.exception("internal error", exc_info=exc)
    await ctx.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")


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
            return await fn(self, req, ctx)
        except Exception as exc:
            await _abort(ctx, exc, self.metrics)
            raise  # unreachable: abort raises
        finally:
            self._leave()

    return wrapper


class ChangelogService(pb_grpc.ChangelogServicer):
    """gRPC adapter over one :class:`LogRegistry` and its blob store."""

    def __init__(
        self, registry: LogRegistry, store: BlobStore, metrics: ServerMetrics, epoch: str
    ) -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.epoch = epoch
        self.reader = HandleReader(self._fetch)
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

    @contextlib.asynccontextmanager
    async def _in_order(self, log_id: str, session: int, seq: int) -> AsyncIterator[None]:
        """Run the ordered part of a writer's call after its earlier calls."""
        calls = self.registry.get(log_id).calls
        await calls.enter(session, seq, self.registry.settings.call_order_timeout_s)
        try:
            yield
        finally:
            calls.leave(session, seq)

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
        batches = _batches(request.changes)
        if not batches:
            raise InvalidArgument("empty append batch")
        async with self._in_order(request.log_id, request.session, request.seq):
            sqn = await self.registry.append(request.log_id, batches)
        return pb.AppendResponse(sqn=sqn)

    @_unary
    async def LastAppendedSqn(
        self, request: pb.LastAppendedSqnRequest, context: grpc.aio.ServicerContext
    ) -> pb.SqnResponse:
        async with self._in_order(request.log_id, request.session, request.seq):
            sqn = self.registry.last_appended_sqn(request.log_id)
        return pb.SqnResponse(sqn=sqn)

    @_unary
    async def PersistDurably(
        self, request: pb.PersistRequest, context: grpc.aio.ServicerContext
    ) -> pb.PersistResponse:
        async with self._in_order(request.log_id, request.session, request.seq):
            if request.changes:
                await self.registry.append(request.log_id, _batches(request.changes))
            pending = self.registry.begin_persist(request.log_id, request.after)
        # Later calls of the writer may go on while the uploads run.
        handle = await self.registry.finish_persist(pending)
        return pb.PersistResponse(handle=handle.to_proto())

    @_unary
    async def Truncate(
        self, request: pb.TruncateRequest, context: grpc.aio.ServicerContext
    ) -> pb.TruncateResponse:
        async with self._in_order(request.log_id, request.session, request.seq):
            self.registry.truncate(request.log_id, request.before)
        return pb.TruncateResponse()

    @_unary
    async def CloseWriter(
        self, request: pb.CloseWriterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseWriterResponse:
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
            handle = ChangelogHandle.from_proto(request.handle)
            check_job_id(handle.job_id)
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


def register(server: grpc.aio.Server, service: ChangelogService) -> Any:
    pb_grpc.add_ChangelogServicer_to_server(service, server)  # type: ignore[no-untyped-call]
