"""One sidecar: store, registry, gRPC server, health, reflection and metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from dstl_client.core._pb import dstl_pb2
from dstl_client.core.errors import ConfigError
from dstl_server.auth import Authenticator, TokenAuthInterceptor
from dstl_server.calls import Calls, register
from dstl_server.forwarder import ParentForwarder
from dstl_server.grpc_limits import server_options
from dstl_server.grpc_metrics import GrpcMetricsInterceptor
from dstl_server.hedging import make_uploader
from dstl_server.housekeeping import StoreHousekeeping
from dstl_server.memory import release_free_memory
from dstl_server.memory_rule import warn_if_memory_short
from dstl_server.metrics import ServerMetrics
from dstl_server.registry import LogRegistry
from dstl_server.service import ChangelogService
from dstl_server.session import SessionHandler
from dstl_server.settings import ServerSettings
from dstl_server.storage import BlobStore, open_store
from dstl_server.storage.cached import CachedBlobStore
from dstl_server.uploader import Uploader

log = logging.getLogger(__name__)


def loop_time() -> float:
    return asyncio.get_running_loop().time()


#: an object larger than read_cache_bytes / this is not cached (one object never
#: empties the whole cache)
READ_CACHE_OBJECT_SHARE = 4
#: how often freed heap memory is handed back to the OS
_TRIM_PERIOD_S = 2.0

SERVICE_NAME = dstl_pb2.DESCRIPTOR.services_by_name["Changelog"].full_name


class DstlServer:
    """A running sidecar. Create, ``await start()``, ``await stop()``.

    ``stop`` is the clean shutdown of SIGTERM: health turns NOT_SERVING, new
    calls are refused, queued changes are flushed and in-flight uploads may
    finish within ``shutdown_grace_s``; then the store is closed. Bound ports
    are in ``port`` (TCP) and ``metrics_port`` after ``start``. All methods
    run on the event loop that called ``start``.
    """

    def __init__(
        self,
        settings: ServerSettings,
        *,
        store: BlobStore | None = None,
        uploader: Uploader | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = ServerMetrics()
        self.epoch = uuid.uuid4().hex
        opened = store or open_store(settings.storage, settings)
        # What this sidecar uploads is kept (bounded) for the reads of a restore on
        # this node; uploads, reads and discards all go through it.
        self.store: BlobStore = (
            CachedBlobStore(
                opened,
                settings.read_cache_bytes,
                max_object_bytes=settings.read_cache_bytes // READ_CACHE_OBJECT_SHARE,
                metrics=self.metrics,
            )
            if settings.read_cache_bytes > 0
            else opened
        )
        # One UploadExecutor: retries, hedging (unless hedge_mode is 'off'), one deadline.
        self.uploader = uploader or make_uploader(self.store, settings, self.metrics)
        # With a parent (forwarding tree), small flushes go to it; else it is None.
        self.forwarder = ParentForwarder.from_settings(settings, self.metrics)
        self.registry = LogRegistry(settings, self.uploader, self.metrics, self.forwarder)
        self.auth = Authenticator.from_settings(
            settings, self.metrics.auth_previous_secret_uses.inc
        )
        # one call lifecycle (gate, principal, bounds, answers) for the service's
        # methods and the Session stream's requests
        self.calls = Calls(self.registry, self.metrics, self.auth)
        self.service = ChangelogService(self.calls, self.store, self.epoch)
        self.sessions = SessionHandler(self.calls)
        self._sweeper: asyncio.Task[None] | None = None
        self.health = health.aio.HealthServicer()
        # The Changelog service's health (readiness) follows the store; temp files
        # of interrupted writes are removed at start and by a periodic sweep.
        self.housekeeping = StoreHousekeeping(
            self.store,
            on_health=self._set_health,
            metrics=self.metrics,
            probe_interval_s=settings.store_probe_interval_s,
            leftover_age_s=2 * max(settings.upload_deadline_s, settings.upload_timeout_s),
        )
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        self._metrics_http: Any = None
        self._stopped = asyncio.Event()

    @property
    def address(self) -> str:
        """Client target: the TCP address, else ``unix://`` path."""
        if self.port is not None:
            host = self.settings.listen.rpartition(":")[0]
            return f"{host}:{self.port}"
        return f"unix://{self.settings.unix_socket}"

    async def start(self) -> None:
        s = self.settings
        # outermost: per-method counts and durations, refused calls included
        interceptors: list[grpc.aio.ServerInterceptor] = [GrpcMetricsInterceptor(self.metrics)]
        if self.auth is not None:
            refusals = self.metrics.auth_refusals.labels("unauthenticated")
            interceptors.append(TokenAuthInterceptor(self.auth, refusals.inc))
        server = grpc.aio.server(
            interceptors=interceptors,
            options=server_options(s),
            maximum_concurrent_rpcs=s.max_concurrent_rpcs,
        )
        register(server, self.calls, self.service, self.sessions)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        if s.listen:
            try:
                if s.tls_cert:
                    creds = grpc.ssl_server_credentials(
                        [(Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes())]
                    )
                    self.port = server.add_secure_port(s.listen, creds)
                else:
                    self.port = server.add_insecure_port(s.listen)
            except RuntimeError as exc:  # grpc reports a failed bind this way
                raise OSError(f"cannot listen on {s.listen} (in use or not available)") from exc
            if not self.port:
                raise OSError(f"cannot listen on {s.listen}")
        if s.unix_socket:
            path = Path(s.unix_socket)
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_socket():
                path.unlink()  # stale socket of a previous run
            try:
                server.add_insecure_port(f"unix://{path}")
            except RuntimeError as exc:
                raise OSError(f"cannot listen on unix socket {path}") from exc
        # Before the first call can arrive: one probe sets the Changelog service's
        # health (readiness) from the store, and the start sweep removes the temp
        # files of writes an earlier process left (no write of ours runs yet).
        await self.housekeeping.start()
        # A store that refuses us (no such bucket, refused credentials, a directory
        # that cannot be written) is a configuration error: stop now. One that is
        # merely unreachable is not: serve, NOT_SERVING until it answers.
        error = self.housekeeping.last_error
        if error is not None and self.store.fatal_at_start(error):
            await self.housekeeping.stop()
            await server.stop(None)
            await self.store.close()
            if s.unix_socket:
                Path(s.unix_socket).unlink(missing_ok=True)
            why = " ".join(error.message.split())  # one line
            raise ConfigError(f"setting storage={s.storage!r}: the store refused us: {why}")
        await server.start()
        if s.unix_socket:
            os.chmod(s.unix_socket, 0o660)
        self._grpc = server
        if s.metrics_port >= 0:
            try:
                httpd, _thread = start_http_server(
                    s.metrics_port, addr=s.metrics_host, registry=self.metrics.registry
                )
            except OSError as exc:
                await self.housekeeping.stop()
                await server.stop(None)
                raise OSError(
                    f"cannot serve metrics on {s.metrics_host}:{s.metrics_port}: {exc.strerror}"
                ) from exc
            self._metrics_http = httpd
            self.metrics_port = httpd.server_address[1]
        self._sweeper = asyncio.get_running_loop().create_task(self._expire_idle_writers())
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        # the start banner (INFO: quiet by default; the CLI prints its READY line anyway)
        log.info(
            "dstl-server serving",
            extra={
                "listen": f"{s.listen.rpartition(':')[0]}:{self.port}" if self.port else "",
                "unix_socket": s.unix_socket,
                "storage": self.store.url,
                "store_up": self.store_up,
                "metrics_port": self.metrics_port,
                "epoch": self.epoch,
            },
        )
        # the container's memory limit against docs/sidecar.md's rule (one WARNING when short)
        warn_if_memory_short(s)
        if not self.store_up:
            log.warning(
                "store %s does not answer yet, health NOT_SERVING until it does: %s",
                self.store.url,
                self.housekeeping.last_error,
                extra={"storage": self.store.url},
            )

    @property
    def store_up(self) -> bool:
        """Whether the store answered its latest probe (health follows it)."""
        return bool(self.housekeeping.up)

    async def _set_health(self, store_up: bool) -> None:
        """Readiness follows the store; liveness ("") does not (a restart would not help)."""
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set(SERVICE_NAME, serving if store_up else not_serving)

    async def _expire_idle_writers(self) -> None:
        """Close writers whose client stopped calling, give freed memory back to the OS.

        One task on the server's loop. The trim (glibc ``malloc_trim``) runs
        every couple of seconds: after a burst of large requests the heap
        keeps freed pages mapped, and RSS would stay near the peak.
        """
        expiry_period = min(60.0, self.settings.writer_idle_timeout_s / 4)
        loop = asyncio.get_running_loop()
        next_expiry = loop.time() + expiry_period
        while True:
            await asyncio.sleep(min(_TRIM_PERIOD_S, max(0.0, next_expiry - loop.time())))
            if loop.time() >= next_expiry:
                self.registry.expire_idle()
                next_expiry = loop.time() + expiry_period
            release_free_memory()

    async def stop(self) -> int:
        """Stop accepting, finish in-flight uploads (within the grace), close.

        Returns how many persist calls were still waiting for their uploads
        when the grace ran out: they are failed with a typed
        :class:`ShuttingDown` (never a bare cancellation), counted in
        ``dstl_persists_abandoned_total`` and logged; the CLI exits non-zero.
        """
        if self._stopped.is_set():
            return 0
        self._stopped.set()
        started = loop_time()
        before = _DrainCounts.of(self)
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self.health.enter_graceful_shutdown()
        await self.housekeeping.stop()
        grace = self.settings.shutdown_grace_s
        deadline = loop_time() + grace
        # New Changelog calls get ShuttingDown; running ones (persists waiting
        # for uploads) go on while the registry flushes its queues.
        self.calls.stop_accepting()
        drained = await self.registry.drain(grace)
        abandoned = 0
        if not drained:
            abandoned = self.registry.abandon(
                f"the sidecar stopped before this upload finished (shutdown grace of {grace:g}s "
                "ran out): the changes are not durable; recover from the last checkpoint"
            )
            self.metrics.persists_abandoned.inc(abandoned)
            log.error(
                "shutdown: uploads still running after the grace; waiting persists "
                "failed with SHUTTING_DOWN",
                extra={"grace_s": grace, "abandoned_persists": abandoned},
            )
        # the handlers of abandoned persists answer now, with their typed error
        if not await self.calls.wait_idle(max(1.0, deadline - loop_time())):
            log.warning("shutdown: calls still running after the grace", extra={"grace_s": grace})
        # Only long-lived streams (health Watch) can be left: cut them now
        # instead of holding the exit for the whole grace period.
        if self._grpc is not None:
            await self._grpc.stop(0.5)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        # losing hedged/failed attempts are deleted before the store goes away
        await self.uploader.close(grace)
        if self.forwarder is not None:
            await self.forwarder.close()
        await self.store.close()
        if self.settings.unix_socket:
            Path(self.settings.unix_socket).unlink(missing_ok=True)
        _log_drained(before, _DrainCounts.of(self), abandoned, loop_time() - started, drained)
        return abandoned

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


@dataclass(frozen=True, slots=True)
class _DrainCounts:
    """What the shutdown line compares: counters read at the start and at the end of ``stop``."""

    held_bytes: int
    flushes: float
    uploads_ok: float
    uploads_failed: float
    uploaded_bytes: float

    @classmethod
    def of(cls, server: DstlServer) -> _DrainCounts:
        sample = server.metrics.registry.get_sample_value
        return cls(
            held_bytes=server.registry.budget.used,
            flushes=sample("dstl_flushes_total", {"trigger": "shutdown"}) or 0.0,
            uploads_ok=sample("dstl_uploads_total", {"result": "ok"}) or 0.0,
            uploads_failed=sample("dstl_uploads_total", {"result": "failed"}) or 0.0,
            uploaded_bytes=sample("dstl_upload_bytes_total") or 0.0,
        )


def _log_drained(
    before: _DrainCounts, after: _DrainCounts, abandoned: int, duration_s: float, drained: bool
) -> None:
    """The one INFO line of a finished shutdown: what it flushed, uploaded, cut off and dropped.

    ``held`` is what was appended and not yet uploaded at SIGTERM; what is
    still held at the end was never asked to persist (no checkpoint can
    refer to it) and goes with the process.
    """
    fields = {
        "duration_s": round(duration_s, 3),
        "drained": drained,
        "held_bytes_at_stop": before.held_bytes,
        "flushes": int(after.flushes - before.flushes),
        "uploads_finished": int(after.uploads_ok - before.uploads_ok),
        "uploaded_bytes": int(after.uploaded_bytes - before.uploaded_bytes),
        "uploads_failed": int(after.uploads_failed - before.uploads_failed),
        "persists_abandoned": abandoned,
        "unpersisted_bytes_dropped": after.held_bytes,
    }
    log.info(
        "shutdown: drained in %(duration_s).2f s: %(flushes)d flush(es), %(uploads_finished)d "
        "upload(s) finished (%(uploaded_bytes)d bytes), %(uploads_failed)d failed, "
        "%(persists_abandoned)d persist(s) failed with SHUTTING_DOWN, "
        "%(unpersisted_bytes_dropped)d bytes never asked to persist dropped",
        fields,
        extra=fields,
    )
