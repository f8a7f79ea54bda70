"""Dynamic checkpoint configuration over REST (FLIP-571), served by the driver with aiohttp.

* ``GET /jobs/{job_id}/checkpoints/configuration`` (or ``.../config``) -> 200
  with the effective values and, under ``"sources"``, where each came from
  (``default``, ``job config`` or ``override``);
* ``PATCH /jobs/{job_id}/checkpoints/configuration`` (or ``.../config``) with
  a JSON object of optional fields, milliseconds as positive integers:

  - ``checkpointInterval``: a checkpoint is a micro-batch, so this is the
    query's trigger interval (at least :data:`MIN_INTERVAL_MS`). It takes
    effect between two batches: the streaming query is stopped after the batch
    in flight and started again from its checkpoint with the new trigger, in
    the same driver (the Spark application, its executors and their warm
    node-local state stay). The reply comes when the switch is scheduled.
  - ``checkpointTimeout``: applies to the batch in flight at once (remaining
    = new timeout - elapsed; at or below zero the batch is aborted and re-run
    by Spark's rules, else its deadline moves).
  - ``materializationInterval``: the background materialization's period.

  Every value is an integer from 1 to :data:`MAX_OVERRIDE_MS` (7 days;
  ``checkpointInterval`` from :data:`MIN_INTERVAL_MS`); ``null`` is refused,
  not ignored (leave a field out to keep its value).

  -> 200 with the new effective values; 400 for a body that is not a JSON
  object, unknown fields or invalid values; 404 for an unknown job; 409 while
  another update of the job is in progress; 413 for a body over 64 KiB; 503
  when the update could not be persisted (nothing was applied).

Every answer, errors included, is a JSON object (``{"error": ...}``), an
unexpected failure too (500); other methods get 405, other paths 404.
Updates are persisted in the job's metadata store *before* they are applied,
so a restarted driver applies them again.

**Bounded** (:mod:`.rest_limits`): the endpoint is a control path in the
driver, whose data path (checkpoint record writes, the sidecar's channels)
needs file descriptors, so it holds at most ``max_connections`` connections
(default :data:`DEFAULT_MAX_CONNECTIONS`): one more is answered ``503``
(JSON) and closed at once. A connection that has not sent a complete request
head within ``head_timeout_s`` (default :data:`DEFAULT_HEAD_TIMEOUT_S`) of
being opened or of its previous answer is closed (slowloris, idle
keep-alive), and a request body must arrive within the same time. A request
head is at most 32 header lines of 8 KiB each.

The server binds ``127.0.0.1`` by default. On any other host it requires a
token: every request must carry ``Authorization: Bearer <token>`` (401
without it), so no one on the network changes a job's checkpoints.

Threads: aiohttp runs on an event loop in a daemon thread of its own; handlers
call the (thread-safe) coordinators there, so a slow update blocks other
requests of this driver only (updates are rare).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import re
import socket
import threading
from typing import Any

from aiohttp import web

from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.overrides import (
    INTERVAL,
    MATERIALIZATION,
    MAX_OVERRIDE_MS,
    MIN_INTERVAL_MS,
    TIMEOUT,
    ConfigUpdateInProgress,
    check_override,
)
from dstl_client.coordinator.rest_limits import (
    DEFAULT_HEAD_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    GuardedServer,
)
from dstl_client.core.errors import ConfigError, DstlError

log = logging.getLogger(__name__)

#: REST field -> keyword of :meth:`CheckpointCoordinator.update_config`
_FIELDS = {
    INTERVAL: "checkpoint_interval_ms",
    TIMEOUT: "checkpoint_timeout_ms",
    MATERIALIZATION: "materialization_interval_ms",
}
_MAX_BODY = 64 * 1024
_PATH = re.compile(r"^/jobs/([^/]+)/checkpoints/(?:configuration|config)$")

__all__ = [
    "DEFAULT_HEAD_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "MAX_OVERRIDE_MS",
    "MIN_INTERVAL_MS",
    "CheckpointConfigServer",
    "is_loopback",
]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


class CheckpointConfigServer:
    """An HTTP endpoint for the coordinators of this driver (one per job id).

    Invariants: a request reaches only the coordinator registered under the
    job id of its path; an update is validated before anything is persisted;
    off loopback, no request without the token gets past the token check;
    at most ``max_connections`` connections are held, none idle or without a
    complete request head for longer than ``head_timeout_s``; every answer is
    a JSON object.
    Threads: requests run on the server's event-loop thread; :meth:`register`,
    :meth:`unregister` and :meth:`close` from any thread (the job table is
    guarded by a lock; coordinators are thread-safe).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str = "",
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S,
    ) -> None:
        if token and not token.strip():  # given, so it must be one (never a guessable blank)
            raise ConfigError("config_token is blank: give a token, or leave it empty (loopback)")
        if not is_loopback(host) and not token:
            raise ConfigError(
                f"the checkpoint configuration endpoint on {host!r} (not loopback) needs a "
                "token: set config_token"
            )
        if isinstance(max_connections, bool) or not 1 <= max_connections <= 4096:
            raise ConfigError(f"max_connections={max_connections!r}: between 1 and 4096")
        if not 0 < head_timeout_s <= 300:
            raise ConfigError(f"head_timeout_s={head_timeout_s!r}: more than 0, at most 300")
        self.host = host
        self._token = token
        self.max_connections = max_connections
        self.head_timeout_s = float(head_timeout_s)
        self._jobs: dict[str, CheckpointCoordinator] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.ServerRunner | None = None
        self._server: GuardedServer | None = None
        self._reaper: asyncio.Task[None] | None = None
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._start(host, port))
            except BaseException as exc:  # reported to the constructor
                failure.append(exc)
                started.set()
                return
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="dstl-config-rest", daemon=True)
        self._thread.start()
        started.wait(30)
        if failure:
            self._thread.join(5)
            self._loop.close()
            raise ConfigError(
                f"cannot serve the configuration endpoint on {host}:{port}: {failure[0]}"
            )
        if not started.is_set():
            raise ConfigError(f"the configuration endpoint on {host}:{port} did not start in 30s")

    async def _start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()

        def request(*args: Any) -> web.BaseRequest:
            message, payload, protocol, writer, task = args
            return web.BaseRequest(
                message, payload, protocol, writer, task, loop, client_max_size=_MAX_BODY
            )

        self._server = GuardedServer(
            self._handle,
            max_connections=self.max_connections,
            head_timeout_s=self.head_timeout_s,
            request_factory=request,
            access_log=None,
        )
        self._runner = web.ServerRunner(self._server, handle_signals=False)
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            self.port = int(sock.getsockname()[1])
            await web.SockSite(self._runner, sock).start()
        except BaseException:
            sock.close()
            raise
        self._reaper = asyncio.create_task(self._server.reap_forever())

    @property
    def connections(self) -> int:
        """Connections held now (for tests and metrics; approximate off the loop thread)."""
        server = self._server
        return 0 if server is None else len(server.live)

    def register(self, coordinator: CheckpointCoordinator) -> None:
        with self._lock:
            self._jobs[coordinator.config.job_id] = coordinator

    def unregister(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._loop.is_closed():
            return

        async def stop() -> None:
            if self._reaper is not None:
                self._reaper.cancel()
            if self._runner is not None:
                runner, self._runner = self._runner, None
                await runner.cleanup()

        future = asyncio.run_coroutine_threadsafe(stop(), self._loop)
        try:
            future.result(10)
        except Exception as exc:
            log.debug("closing the configuration endpoint: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # --------------------------------------------------------------- requests
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every request: bookkeeping for the head timeout, then :meth:`_answer`; JSON always."""
        server = self._server
        handler = request.protocol
        if server is not None:
            server.request_began(handler)
        try:
            return await self._answer(request)
        except web.HTTPException as exc:  # aiohttp's own (413 from the body reader...)
            return _error(exc.status, f"{exc.reason}: {request.method} {request.path}")
        except Exception as exc:  # a bug: still a JSON answer
            log.exception("configuration endpoint: %s %s failed", request.method, request.path)
            return _error(500, f"internal error: {type(exc).__name__}")
        finally:
            if server is not None:
                server.request_ended(handler)

    async def _answer(self, request: web.BaseRequest) -> web.Response:
        if self._token:
            given = request.headers.get("Authorization", "")
            want = f"Bearer {self._token}"
            if not hmac.compare_digest(given.encode(), want.encode()):
                return _error(401, "missing or wrong token (Authorization: Bearer <token>)")
        m = _PATH.match(request.path)
        if m is None:
            return _error(404, f"Not Found: {request.method} {request.path}")
        job_id = m.group(1)
        if request.method in ("GET", "HEAD"):
            return self._get(job_id)
        if request.method == "PATCH":
            return await self._patch(request, job_id)
        return _error(
            405,
            f"Method Not Allowed: {request.method} {request.path}",
            headers={"Allow": "GET, HEAD, PATCH"},
        )

    def _coordinator(self, job_id: str) -> CheckpointCoordinator | None:
        with self._lock:
            return self._jobs.get(job_id)

    def _get(self, job_id: str) -> web.Response:
        coord = self._coordinator(job_id)
        if coord is None:
            return _error(404, f"unknown job {job_id!r}")
        return web.json_response(coord.effective_config())

    async def _patch(self, request: web.BaseRequest, job_id: str) -> web.Response:
        coord = self._coordinator(job_id)
        if coord is None:
            return _error(404, f"unknown job {job_id!r}")
        try:
            async with asyncio.timeout(self.head_timeout_s):
                raw = await request.read()
        except TimeoutError:
            return _error(408, f"the body did not arrive within {self.head_timeout_s:g}s")
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            return _error(400, f"unknown fields {unknown}; the fields are {sorted(_FIELDS)}")
        try:
            for name, value in body.items():
                check_override(name, value)  # null and out-of-range values included
            effective = coord.update_config(**{_FIELDS[k]: v for k, v in body.items()})
        except ConfigError as exc:
            return _error(400, exc.message)
        except ConfigUpdateInProgress as exc:
            return _error(409, exc.message)
        except DstlError as exc:  # the metadata store refused: nothing was applied
            return _error(503, f"the update was not persisted, nothing changed: {exc.message}")
        log.info(
            "checkpoint configuration updated",
            extra={"job_id": job_id, "changes": body, "effective": effective},
        )
        return web.json_response(effective)
