"""The log registry: the directory of this node's writers, their quotas, call order and memory."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    DstlError,
    InvalidArgument,
    LogNotFound,
    ShuttingDown,
    TooManyWriters,
    UploadFailed,
)
from dstl_client.core.handle import ChangelogHandle
from dstl_client.core.keys import check_job_id
from dstl_server.auth import Principal, check_job
from dstl_server.call_order import CallOrder
from dstl_server.forwarder import ParentForwarder
from dstl_server.handle_size import RESPONSE_MARGIN_BYTES, check_travels
from dstl_server.log import PendingPersist, WriterLog
from dstl_server.metrics import ServerMetrics
from dstl_server.parts import CallParts
from dstl_server.settings import ServerSettings
from dstl_server.throttle import MemoryBudget
from dstl_server.uploader import Uploader
from dstl_server.uploads import Uploads

log = logging.getLogger(__name__)

_MAX_KEY_GROUP = 1 << 24
#: what a call refused before its parts were read may have carried: one change
_MAY_HAVE_CARRIED = (pb.KeyGroupChanges(count=1),)


class LogRegistry:
    """The directory of this sidecar's writers, their quotas, call order and memory budget.

    The writer contract (FLIP-158) is each :class:`~dstl_server.log.WriterLog`'s:
    SQNs, part checks, persists that reuse sections already uploaded or
    uploading, upload outcomes. The registry finds the writer of a call
    (``LogNotFound``; its idle timer), enforces ``max_writers`` and
    ``max_writers_per_job``, runs each call in its turn and charges and
    releases the :class:`~dstl_server.throttle.MemoryBudget`; ``truncate``
    frees memory but never deletes an object (a handle may reference it);
    ``close_writer`` drops unpersisted changes.

    The writer calls ``append``, ``persist``, ``truncate`` and
    ``last_appended_sqn`` take the client's ``session`` and ``seq`` and run
    in that order (one preamble, :meth:`_turn`, over
    :class:`~dstl_server.call_order.CallOrder`; ``seq == 0`` is unordered):
    everything a call validates or applies happens inside its turn, and a
    call whose changes are refused there fails its session. ``persist``'s
    turn ends once its changesets are queued for upload, so later calls of
    the writer run while its uploads do. Uploads are owned by ``uploads``.

    Event-loop only: every method runs on the server's loop.
    """

    def __init__(
        self,
        settings: ServerSettings,
        uploader: Uploader,
        metrics: ServerMetrics,
        forwarder: ParentForwarder | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._logs: dict[str, WriterLog] = {}
        self._writers_per_job: dict[str, int] = {}
        self.budget = MemoryBudget(
            settings.max_in_flight_bytes,
            settings.backpressure_timeout_s,
            self._relieve_pressure,
            on_change=metrics.unuploaded_bytes.set,
        )
        self.uploads = Uploads(
            settings,
            uploader,
            metrics,
            self.budget,
            open_writers=lambda job_id: self._writers_per_job.get(job_id, 0),
            forwarder=forwarder,
        )
        self.order = CallOrder(self.budget, settings.call_order_timeout_s, metrics)
        #: sizes + payload per response message (the rest: header fields)
        self.max_response_bytes = settings.max_request_bytes - RESPONSE_MARGIN_BYTES
        self._stopping = False
        #: persist calls waiting for their uploads right now
        self.waiting_persists = 0

    # ---------------------------------------------------------------- lookup
    def owned(
        self, principal: Principal | None, log_id: str, *, admin_ok: bool = False
    ) -> WriterLog:
        """The writer ``log_id`` names, if the caller's job owns it (:meth:`get`: its idle
        timer is left alone)."""
        wl = self.get(log_id)
        check_job(principal, wl.job_id, admin_ok=admin_ok)
        return wl

    def get(self, log_id: str) -> WriterLog:
        """The writer ``log_id`` names, for a look at it (authorising a call): its idle
        timer is left alone, so a call refused before it reaches the writer (another job's
        token) never keeps it alive. The writer calls below refresh it."""
        wl = self._logs.get(log_id)
        if wl is None:
            raise LogNotFound(
                f"unknown writer {log_id[:64]!r}: never created, closed, expired after "
                f"{self.settings.writer_idle_timeout_s:g}s without a call, or the sidecar "
                "restarted (unpersisted changes are gone; recover from the last checkpoint)"
            )
        return wl

    def _called(self, log_id: str) -> WriterLog:
        """The writer of a call that reached the registry: its idle timer restarts."""
        wl = self.get(log_id)
        wl.last_call = time.monotonic()
        return wl

    def _open(self, log_id: str) -> WriterLog:
        """The writer of a call in its turn, open (closed meanwhile: LogNotFound)."""
        wl = self._called(log_id)
        wl.check_open()
        return wl

    def __len__(self) -> int:
        return len(self._logs)

    # ---------------------------------------------------------------- writers
    def create_writer(
        self, job_id: str, operator_id: str, key_group_range: tuple[int, int]
    ) -> WriterLog:
        if self._stopping:
            raise ShuttingDown("the sidecar is shutting down")
        check_job_id(job_id)
        if not operator_id or len(operator_id) > 256:
            raise InvalidArgument("operator_id must be 1-256 characters")
        first, last = key_group_range
        if not 0 <= first <= last < _MAX_KEY_GROUP:
            raise InvalidArgument(
                f"bad key-group range [{first}, {last}]: need 0 <= first <= last < {_MAX_KEY_GROUP}"
            )
        if len(self._logs) >= self.settings.max_writers:
            self.metrics.writer_quota_refusals.labels("node").inc()
            raise TooManyWriters(
                f"this sidecar holds {len(self._logs)} writers (max_writers="
                f"{self.settings.max_writers}); close writers or raise the limit"
            )
        per_job = self._writers_per_job.get(job_id, 0)
        if per_job >= self.settings.max_writers_per_job:
            self.metrics.writer_quota_refusals.labels("job").inc()
            raise TooManyWriters(
                f"job {job_id!r} holds {per_job} writers on this sidecar (max_writers_per_job="
                f"{self.settings.max_writers_per_job}); close writers or raise the limit"
            )
        wl = WriterLog(job_id, operator_id, key_group_range)
        wl.last_call = time.monotonic()
        self._logs[wl.log_id] = wl
        self._writers_per_job[job_id] = self._writers_per_job.get(job_id, 0) + 1
        self.metrics.writers.set(len(self._logs))
        log.info(
            "writer created",
            extra={
                "job_id": job_id,
                "log_id": wl.log_id,
                "operator_id": operator_id,
                "key_groups": list(key_group_range),
            },
        )
        return wl

    # ---------------------------------------------------------------- ordered calls
    def _turn(
        self, log_id: str, session: int, seq: int, parts: CallParts = ()
    ) -> AbstractAsyncContextManager[WriterLog]:
        """The writer of a call, in the call's turn: the one preamble of every ordered call.

        Its idle timer restarts; ``seq == 0`` (unordered: a Session stream's order is its
        own) takes no turn and no time.
        """
        wl = self._called(log_id)
        if not seq:
            return contextlib.nullcontext(wl)
        return self._ordered(wl, session, seq, parts)

    @contextlib.asynccontextmanager
    async def _ordered(
        self, wl: WriterLog, session: int, seq: int, parts: CallParts
    ) -> AsyncIterator[WriterLog]:
        async with self.order.turn(wl, session, seq, parts):
            yield wl

    async def append(self, log_id: str, parts: CallParts, *, session: int = 0, seq: int = 0) -> int:
        """Append a call's parts (all or nothing) in its turn; return their SQN."""
        async with self._turn(log_id, session, seq, parts) as wl:
            if not parts:
                raise InvalidArgument("empty append batch")
            with self.order.changes_land(wl, session, seq, parts):
                return await self._append(log_id, parts)

    async def refuse(
        self, log_id: str, error: DstlError, *, session: int = 0, seq: int = 0
    ) -> None:
        """Refuse a writer call with ``error`` in its turn (raises it): one refused before its
        parts were decoded (too many of them). It may have carried changes, so its session
        fails, like one whose changes are refused."""
        async with self._turn(log_id, session, seq) as wl:
            with self.order.changes_land(wl, session, seq, _MAY_HAVE_CARRIED):
                raise error

    async def last_appended_sqn(self, log_id: str, *, session: int = 0, seq: int = 0) -> int:
        async with self._turn(log_id, session, seq):
            return self._open(log_id).rollover()

    async def persist(
        self,
        log_id: str,
        after: int,
        parts: CallParts = (),
        *,
        session: int = 0,
        seq: int = 0,
    ) -> ChangelogHandle:
        """Durable handle for every change of the writer with SQN >= ``after``.

        ``parts`` (the client's still-buffered changes) are appended first.
        The turn ends when what is new is queued for upload: changes appended
        by later calls are not in the handle, whatever happens while the
        uploads run, and those calls need not wait for them.
        """
        pending = await self.begin_persist(log_id, after, parts, session=session, seq=seq)
        return await self.await_handle(pending)

    async def begin_persist(
        self,
        log_id: str,
        after: int,
        parts: CallParts = (),
        *,
        session: int = 0,
        seq: int = 0,
    ) -> PendingPersist:
        """The ordered part of :meth:`persist` (its turn); :meth:`await_handle` finishes it.

        The Session stream runs this in stream order and awaits the handle in
        a task of its own, so the stream's later requests go on meanwhile.
        """
        async with self._turn(log_id, session, seq, parts) as wl:
            if parts:
                with self.order.changes_land(wl, session, seq, parts):
                    await self._append(log_id, parts)
            self.metrics.persist_requests.inc()
            try:
                return self._called(log_id).begin_persist(after, self.uploads)
            except DstlError:
                self.metrics.persist_failures.inc()
                raise

    async def truncate(self, log_id: str, before: int, *, session: int = 0, seq: int = 0) -> None:
        async with self._turn(log_id, session, seq):
            self.budget.release(self._open(log_id).truncate(before))

    async def _append(self, log_id: str, parts: CallParts) -> int:
        """Check every part first (the writer's), charge them, then append them all."""
        wl = self._called(log_id)  # closed while the call waited for its turn: LogNotFound
        checked = wl.check_parts(parts, self.settings.max_change_bytes)
        charged = checked.charge
        budget = self.budget
        if budget.over:
            self.metrics.backpressure_waits.inc()
            await budget.acquire(charged)
            if wl.closed:  # closed while we waited for memory
                budget.release(charged)
                wl.check_open()
        else:
            budget.take(charged)  # room: no wait, no await
        wl.append_parts(checked.parts, checked.nbytes)
        sqn = wl.active_sqn  # before a pre-emptive upload closes the changeset
        metrics = self.metrics
        metrics.appended_bytes.inc(checked.nbytes)
        metrics.appended_changes.inc(checked.count)
        metrics.append_requests.inc()
        threshold = self.settings.preemptive_persist_threshold
        if threshold and wl.active_bytes >= threshold:
            wl.upload_all(self.uploads)
        return sqn

    async def await_handle(self, pending: PendingPersist) -> ChangelogHandle:
        """Wait for the uploads the persist needs; its handle (after the turn), counted."""
        wl = pending.log
        self.waiting_persists += 1
        try:
            handle = await wl.await_handle(pending)
        except DstlError as exc:
            self.metrics.persist_failures.inc()
            if isinstance(exc, UploadFailed):
                log.warning(
                    "persist failed: %s",
                    exc.message,
                    extra={
                        "job_id": wl.job_id,
                        "log_id": wl.log_id,
                        "duration_s": round(time.perf_counter() - pending.started, 6),
                    },
                )
            raise
        finally:
            self.waiting_persists -= 1
        self.metrics.persist_latency.observe(time.perf_counter() - pending.started)
        check_travels(handle, self.max_response_bytes)
        return handle

    # ---------------------------------------------------------------- unordered
    def close_writer(self, log_id: str) -> None:
        wl = self._called(log_id)
        del self._logs[log_id]
        n = self._writers_per_job.get(wl.job_id, 1) - 1
        if n:
            self._writers_per_job[wl.job_id] = n
        else:
            self._writers_per_job.pop(wl.job_id, None)
        self.budget.release(wl.close())
        self.metrics.writers.set(len(self._logs))

    def _relieve_pressure(self) -> None:
        """Memory is full: upload every writer's unpersisted changes now."""
        for wl in list(self._logs.values()):
            if wl.active_bytes or wl.not_uploaded:
                wl.upload_all(self.uploads)
        self.uploads.flush_all("pressure")

    # ---------------------------------------------------------------- expiry
    def expire_idle(self, now: float | None = None) -> int:
        """Close writers with no call for ``writer_idle_timeout_s``; return how many.

        A writer whose client died would otherwise hold a slot (and its
        unpersisted bytes) forever. A writer with an upload in flight is not
        idle. Closing drops only unpersisted changes: objects its handles
        reference stay readable.
        """
        now = time.monotonic() if now is None else now
        limit = self.settings.writer_idle_timeout_s
        idle = [
            log_id
            for log_id, wl in self._logs.items()
            if now - wl.last_call >= limit and not wl.uploading
        ]
        for log_id in idle:
            wl = self._logs[log_id]
            log.warning(
                "writer expired: no call within writer_idle_timeout_s",
                extra={"job_id": wl.job_id, "log_id": log_id, "idle_timeout_s": limit},
            )
            self.close_writer(log_id)
        if idle:
            self.metrics.writers_expired.inc(len(idle))
        return len(idle)

    # ---------------------------------------------------------------- shutdown
    def abandon(self, reason: str) -> int:
        """Fail every upload still running (shutdown past its grace); return waiting persists.

        The persists waiting on them get :class:`ShuttingDown` (typed, with
        ``reason``) instead of a cancelled call; the caller reports the count.
        """
        waiting = self.waiting_persists
        self.uploads.abandon(ShuttingDown(reason))
        return waiting

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting writers; flush queues; wait for running uploads."""
        self._stopping = True
        return await self.uploads.drain(timeout_s)
