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

  -> 200 with the new effective values; 400 for a body that is not a JSON
  object, unknown fields or invalid values; 404 for an unknown job; 409 while
  another update of the job is in progress; 503 when the update could not be
  persisted (nothing was applied).

Every answer, errors included, is a JSON object (``{"error": ...}``); other
methods get 405, other paths 404. Updates are persisted in the job's metadata
store *before* they are applied, so a restarted driver applies them again.

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
import socket
import threading
from typing import Any

from aiohttp import web

from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.overrides import (
    INTERVAL,
    MATERIALIZATION,
    MIN_INTERVAL_MS,
    TIMEOUT,
    ConfigUpdateInProgress,
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
_PATHS = ("/jobs/{job_id}/checkpoints/configuration", "/jobs/{job_id}/checkpoints/config")

__all__ = ["MIN_INTERVAL_MS", "CheckpointConfigServer", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class CheckpointConfigServer:
    """An HTTP endpoint for the coordinators of this driver (one per job id).

    Invariants: a request reaches only the coordinator registered under the
    job id of its path; an update is validated before anything is persisted;
    off loopback, no request without the token gets past :meth:`_auth`.
    Threads: requests run on the server's event-loop thread; :meth:`register`,
    :meth:`unregister` and :meth:`close` from any thread (the job table is
    guarded by a lock; coordinators are thread-safe).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, token: str = "") -> None:
        if not is_loopback(host) and not token:
            raise ConfigError(
                f"the checkpoint configuration endpoint on {host!r} (not loopback) needs a "
                "token: set config_token"
            )
        self.host = host
        self._token = token
        self._jobs: dict[str, CheckpointCoordinator] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
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
        app = web.Application(
            middlewares=[self._auth, self._json_errors], client_max_size=_MAX_BODY
        )
        for path in _PATHS:
            app.router.add_get(path, self._get)
            app.router.add_patch(path, self._patch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
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
        if self._runner is not None:
            runner, self._runner = self._runner, None
            future = asyncio.run_coroutine_threadsafe(runner.cleanup(), self._loop)
            try:
                future.result(10)
            except Exception as exc:
                log.debug("closing the configuration endpoint: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # ------------------------------------------------------------- middleware
    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self._token:
            given = request.headers.get("Authorization", "")
            want = f"Bearer {self._token}"
            if not hmac.compare_digest(given.encode(), want.encode()):
                return _error(401, "missing or wrong token (Authorization: Bearer <token>)")
        return await handler(request)  # type: ignore[no-any-return]

    @web.middleware
    async def _json_errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """aiohttp's own errors (404, 405, 413...) as JSON objects too."""
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(exc.status, f"{exc.reason}: {request.method} {request.path}")

    # --------------------------------------------------------------- handlers
    def _coordinator(self, request: web.Request) -> CheckpointCoordinator | None:
        with self._lock:
            return self._jobs.get(request.match_info["job_id"])

    async def _get(self, request: web.Request) -> web.Response:
        coord = self._coordinator(request)
        if coord is None:
            return _error(404, f"unknown job {request.match_info['job_id']!r}")
        return web.json_response(coord.effective_config())

    async def _patch(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        coord = self._coordinator(request)
        if coord is None:
            return _error(404, f"unknown job {job_id!r}")
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            return _error(400, f"unknown fields {unknown}; the fields are {sorted(_FIELDS)}")
        try:
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
