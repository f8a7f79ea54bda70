"""Dynamic checkpoint configuration over REST (FLIP-571), served by the driver.

* ``GET /jobs/{job_id}/checkpoints/config`` -> 200 with the effective values;
* ``PATCH /jobs/{job_id}/checkpoints/configuration`` with a JSON body of
  optional fields ``checkpointTimeout`` and ``materializationInterval``
  (milliseconds, positive integers) -> 200 with the new effective values;
  400 for a malformed body or invalid values, 404 for an unknown job, 409 while
  another update of the job is in progress.

In this system a checkpoint is a micro-batch, paced by the query's trigger;
the periodic background work FLIP-158 decouples from checkpoints is the
materialization, so its interval is the tunable interval here. A field
``checkpointInterval`` is refused with a 400 that says so. Updates are
persisted next to the checkpoint records before they are applied, so a
restarted driver keeps them; a new timeout governs the batch in flight too.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.overrides import ConfigUpdateInProgress
from dstl_client.core.errors import ConfigError

log = logging.getLogger(__name__)

_CONFIG = re.compile(r"^/jobs/([^/]+)/checkpoints/config/?$")
_CONFIGURATION = re.compile(r"^/jobs/([^/]+)/checkpoints/configuration/?$")
_FIELDS = {
    "checkpointTimeout": "checkpoint_timeout_ms",
    "materializationInterval": "materialization_interval_ms",
}
_MAX_BODY = 64 * 1024


class CheckpointConfigServer:
    """An HTTP endpoint for the coordinators of this driver (one per job id).

    Invariants: a request reaches only the coordinator registered under the
    job id of its path; an update is validated before anything is persisted.
    Threads: requests run on the server's handler threads (one per request);
    :meth:`register`, :meth:`unregister` and :meth:`close` from any thread
    (the job table is guarded by a lock; coordinators are thread-safe).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._jobs: dict[str, CheckpointCoordinator] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_PATCH(self) -> None:
                server._handle(self, "PATCH")

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="dstl-config-rest", daemon=True
        )
        self._thread.start()

    def register(self, coordinator: CheckpointCoordinator) -> None:
        with self._lock:
            self._jobs[coordinator.config.job_id] = coordinator

    def unregister(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    # --------------------------------------------------------------- handling
    def _handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        path = req.path.split("?", 1)[0]
        pattern = _CONFIG if method == "GET" else _CONFIGURATION
        m = pattern.match(path)
        if m is None:
            return _reply(req, HTTPStatus.NOT_FOUND, {"error": f"no route {method} {path}"})
        with self._lock:
            coord = self._jobs.get(m.group(1))
        if coord is None:
            return _reply(req, HTTPStatus.NOT_FOUND, {"error": f"unknown job {m.group(1)!r}"})
        if method == "GET":
            return _reply(req, HTTPStatus.OK, coord.effective_config())
        try:
            length = int(req.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            return _reply(req, HTTPStatus.BAD_REQUEST, {"error": "bad Content-Length"})
        try:
            body = json.loads(req.rfile.read(length) or b"{}")
        except ValueError:
            return _reply(req, HTTPStatus.BAD_REQUEST, {"error": "the body is not JSON"})
        if not isinstance(body, dict):
            return _reply(req, HTTPStatus.BAD_REQUEST, {"error": "the body must be a JSON object"})
        if "checkpointInterval" in body:
            return _reply(
                req,
                HTTPStatus.BAD_REQUEST,
                {
                    "error": "checkpointInterval is the Spark query's trigger (one checkpoint per "
                    "micro-batch); set materializationInterval instead"
                },
            )
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            return _reply(req, HTTPStatus.BAD_REQUEST, {"error": f"unknown fields {unknown}"})
        try:
            effective = coord.update_config(**{_FIELDS[k]: v for k, v in body.items()})
        except ConfigError as exc:
            return _reply(req, HTTPStatus.BAD_REQUEST, {"error": exc.message})
        except ConfigUpdateInProgress as exc:
            return _reply(req, HTTPStatus.CONFLICT, {"error": exc.message})
        log.info("job %s checkpoint configuration updated: %s", m.group(1), effective)
        return _reply(req, HTTPStatus.OK, effective)


def _reply(req: BaseHTTPRequestHandler, status: HTTPStatus, doc: dict[str, Any]) -> None:
    data = json.dumps(doc).encode()
    req.send_response(status)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)
