"""The ``dstl.v1.Changelog`` gRPC service: protobuf in, registry calls, protobuf out.

Every method but the writer streams ``Session`` and ``Mux``
(:mod:`dstl_server.session`) is here. Each call runs through the one call
lifecycle (:mod:`dstl_server.calls`: gate, bounds, decode check, principal), which also maps its errors to gRPC statuses, once:
a :class:`~dstl_client.core.errors.DstlError` becomes its ``grpc_code`` with
its message and its ``kind`` travels in the ``dstl-error-kind`` trailer, so
the client raises the same class; anything else is logged and INTERNAL.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import InvalidArgument, PermissionDenied, ShuttingDown
from dstl_client.core.format import ChangesetView
from dstl_client.core.handle import ChangelogHandle
from dstl_client.core.keys import check_job_id, check_key_of_job, job_prefix
from dstl_client.core.reader import HandleReader
from dstl_server.auth import Principal, check_job, check_node
from dstl_server.calls import Calls, check_decoded, unary
from dstl_server.handle_size import RESPONSE_MARGIN_BYTES
from dstl_server.parts import parts_of
from dstl_server.request_bounds import MAX_DISCARD_KEYS, MAX_READ_KEY_GROUPS
from dstl_server.storage.base import BlobStore, validate_key

log = logging.getLogger(__name__)

_MAX_LIST_PAGE = 1000  # keys a ListObjects call examines at most (page_size 0 or more)
_LIST_ENTRY_OVERHEAD = 8  # tag and length of one repeated ObjectInfo

#: a batched ReadChanges message is sent once its changesets reach this many bytes
#: (a larger changeset piece goes alone, up to the message limit)
READ_BATCH_BYTES = 1 << 20
#: upper bound of a Changeset's framing and numbers inside a batched message
_CHANGESET_FIXED_BOUND = 48
#: a caller's max_message_bytes never makes messages carry less than this
MIN_READ_MESSAGE_BYTES = 64 << 10


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


class ChangelogService:
    """gRPC adapter over one :class:`~dstl_server.registry.LogRegistry` and its blob store:
    every method of ``dstl.v1.Changelog`` but ``Session`` and ``Mux`` (registered by name,
    :func:`~dstl_server.calls.register`).

    Every call is decoded (undecodable bytes: INVALID_ARGUMENT), authorised
    against the job that *owns* what it names (the writer of a log id, the
    job of a handle, the prefix of an object key; see :mod:`dstl_server.auth`)
    and handed to the registry, which runs a writer's calls in client order
    (with their ``session``/``seq``); the answer is encoded, an error mapped
    to its status once (:meth:`~dstl_server.calls.Calls.abort`). Draining:
    after :meth:`~dstl_server.calls.Calls.stop_accepting` new calls get
    ShuttingDown. Event-loop only.
    """

    def __init__(self, calls: Calls, store: BlobStore, epoch: str) -> None:
        self.calls = calls
        self.registry = calls.registry
        self.store = store
        self.metrics = calls.metrics
        self.epoch = epoch
        self.reader = HandleReader(self._fetch)
        #: a batched message holds changesets up to this many bytes (framing included)
        self._read_batch_bytes = min(READ_BATCH_BYTES, calls.max_response_bytes)

    async def _fetch(self, key: str, offset: int, length: int) -> bytes:
        data = await self.store.get(key, offset, length)
        self.metrics.read_bytes.inc(len(data))
        return data

    @unary
    async def CreateWriter(
        self,
        request: pb.CreateWriterRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
    ) -> pb.CreateWriterResponse:
        check_job(caller, request.job_id, admin_ok=False)
        wl = self.registry.create_writer(
            request.job_id, request.operator_id, (request.first_key_group, request.last_key_group)
        )
        return pb.CreateWriterResponse(
            log_id=wl.log_id,
            server_epoch=self.epoch,
            initial_sqn=wl.active_sqn,
            max_change_bytes=self.registry.settings.max_change_bytes,
            accepts_packed=True,
        )

    @unary
    async def Append(
        self,
        request: pb.AppendRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
    ) -> pb.AppendResponse:
        self.registry.owned(caller, request.log_id)
        sqn = await self.registry.append(
            request.log_id, parts_of(request), session=request.session, seq=request.seq
        )
        return pb.AppendResponse(sqn=sqn)

    @unary
    async def LastAppendedSqn(
        self,
        request: pb.LastAppendedSqnRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
    ) -> pb.SqnResponse:
        self.registry.owned(caller, request.log_id)
        sqn = await self.registry.last_appended_sqn(
            request.log_id, session=request.session, seq=request.seq
        )
        return pb.SqnResponse(sqn=sqn)

    @unary
    async def PersistDurably(
        self,
        request: pb.PersistRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
    ) -> pb.PersistResponse:
        self.registry.owned(caller, request.log_id)
        handle = await self.registry.persist(
            request.log_id,
            request.after,
            parts_of(request),
            session=request.session,
            seq=request.seq,
        )
        return pb.PersistResponse(handle=handle.to_proto())

    @unary
    async def Truncate(
        self,
        request: pb.TruncateRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
    ) -> pb.TruncateResponse:
        self.registry.owned(caller, request.log_id)
        await self.registry.truncate(
            request.log_id, request.before, session=request.session, seq=request.seq
        )
        return pb.TruncateResponse()

    @unary
    async def CloseWriter(
        self,
        request: pb.CloseWriterRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
    ) -> pb.CloseWriterResponse:
        self.registry.owned(caller, request.log_id, admin_ok=True)
        self.registry.close_writer(request.log_id)
        return pb.CloseWriterResponse()

    async def ReadChanges(
        self, request: pb.ReadChangesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadChangesResponse]:
        self.metrics.reads.inc()
        calls = self.calls
        try:
            calls.enter()
        except ShuttingDown as exc:
            await calls.abort(context, exc)
        try:
            check_decoded(request)
            principal = calls.principal(context)
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
            piece_limit = calls.max_response_bytes
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
            await calls.abort(context, exc)
        finally:
            calls.leave()

    @unary
    async def DiscardObjects(
        self,
        request: pb.DiscardObjectsRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
    ) -> pb.DiscardObjectsResponse:
        check_job_id(request.job_id)
        check_job(caller, request.job_id)
        if len(request.object_keys) > MAX_DISCARD_KEYS:  # counted before the list is built
            raise InvalidArgument(f"at most {MAX_DISCARD_KEYS} keys per call")
        keys = list(request.object_keys)
        for key in keys:
            check_key_of_job(request.job_id, key)
        deleted = await self.store.delete(keys) if keys else 0
        self.metrics.discarded_objects.inc(deleted)
        return pb.DiscardObjectsResponse(deleted=deleted)

    @unary
    async def ListObjects(
        self,
        request: pb.ListObjectsRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
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
        check_job(caller, job_id)
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
                    if encoded > self.calls.max_response_bytes and objects:
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

    @unary
    async def Forward(
        self,
        request: pb.ForwardRequest,
        context: grpc.aio.ServicerContext,
        caller: Principal | None,
    ) -> pb.ForwardResponse:
        """A child node's flush, answered once the object holding it is complete."""
        check_node(caller)
        uploads = self.registry.uploads
        entries = await uploads.accept_forwarded(
            request.job_id, list(request.sections), sender=request.sender
        )
        places = [pb.SectionPlacement(offset=e.offset, length=e.length) for e in entries]
        return pb.ForwardResponse(object_key=entries[0].object_key, placements=places)
