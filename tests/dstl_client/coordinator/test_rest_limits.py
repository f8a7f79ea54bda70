"""The driver's REST endpoint under hostile input: bounded values, JSON answers, bounded
connections (real sockets against the real endpoint, a small cap configured for speed)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client.client import ChangelogClient
from dstl_client.coordinator.overrides import MAX_OVERRIDE_MS
from dstl_client.coordinator.rest import (
    DEFAULT_HEAD_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    CheckpointConfigServer,
)
from dstl_client.core.errors import ConfigError
from dstl_server.testing import ServerProcess
from tests.dstl_client.coordinator._helpers import ROWS
from tests.dstl_client.state._jobs import make_coordinator, runner

CAP = 4
HEAD_S = 0.5


@pytest.fixture
def rest() -> Iterator[CheckpointConfigServer]:
    server = CheckpointConfigServer(max_connections=CAP, head_timeout_s=HEAD_S)
    try:
        yield server
    finally:
        server.close()


def raw(server: CheckpointConfigServer, request: bytes, *, timeout: float = 5.0) -> bytes:
    """Send ``request`` on a new connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(request)
        return read_to_eof(s, timeout)


def read_to_eof(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    chunks: list[bytes] = []
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def http(
    server: CheckpointConfigServer, method: str, path: str, body: bytes = b""
) -> tuple[int, str, object]:
    """One request (Connection: close): status, content type, decoded JSON body."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    answer = raw(server, head.encode() + body)
    head_bytes, _, payload = answer.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    ctype = next(
        (ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.lower().startswith("content-type")),
        "",
    )
    return status, ctype, json.loads(payload) if payload else None


def test_values_are_bounded_null_is_refused_and_every_answer_is_json(
    tmp_path: Path, sidecar: ServerProcess, rest: CheckpointConfigServer
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="bounds", checkpoint_timeout_s=60)
    rest.register(coord)
    path = "/jobs/bounds/checkpoints/configuration"
    try:
        for bad in (
            b'{"checkpointTimeout": 1' + b"0" * 400 + b"}",  # 10**400: a 500 text/plain before
            json.dumps({"checkpointInterval": 10**20}).encode(),
            json.dumps({"materializationInterval": MAX_OVERRIDE_MS + 1}).encode(),
            b'{"checkpointTimeout": null}',
            b'{"checkpointInterval": null, "checkpointTimeout": 5000}',
            b"[" * 50_000,  # nested past the JSON decoder's recursion limit
        ):
            status, ctype, doc = http(rest, "PATCH", path, bad)
            assert status == 400, (bad[:60], status, doc)
            assert ctype.startswith("application/json") and isinstance(doc, dict)
            assert doc["error"]
        assert coord.config.checkpoint_timeout_s == 60  # nothing applied
        assert coord.effective_config()["sources"]["checkpointTimeout"] == "job config"
        top = json.dumps({"checkpointTimeout": MAX_OVERRIDE_MS}).encode()
        status, _, doc = http(rest, "PATCH", path, top)
        assert (
            status == 200 and isinstance(doc, dict) and doc["checkpointTimeout"] == MAX_OVERRIDE_MS
        )
        # other methods, paths and oversized bodies: JSON too
        for method, where, body, want in (
            ("DELETE", path, b"", 405),
            ("GET", "/nope", b"", 404),
            ("PATCH", path, b"{" + b" " * (70 * 1024) + b"}", 413),
        ):
            status, ctype, doc = http(rest, method, where, body)
            assert status == want and ctype.startswith("application/json"), (method, where)
            assert isinstance(doc, dict) and doc["error"]
    finally:
        coord.close()


def test_idle_connections_are_capped_and_timed_out(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient, rest: CheckpointConfigServer
) -> None:
    """More idle unauthenticated connections than the cap: the extras are answered 503 and
    closed, the held ones are closed after the head timeout, and the driver goes on (a
    checkpoint record is written, a normal request is answered)."""
    coord = make_coordinator(tmp_path, sidecar.address, job_id="idle")
    rest.register(coord)
    socks = [socket.create_connection(("127.0.0.1", rest.port), timeout=5) for _ in range(CAP * 5)]
    try:
        refused = 0
        for s in socks[CAP:]:
            answer = read_to_eof(s, 5.0)  # closed by the server at once
            assert answer.startswith(b"HTTP/1.1 503"), answer[:80]
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"].startswith(
                "too many connections"
            )
            refused += 1
        assert refused == CAP * 4
        assert rest.connections <= CAP
        # a slowloris on one of the held ones: a head that never ends
        socks[0].sendall(b"GET /jobs/idle/checkpoints/config HTTP/1.1\r\nX-A: 1\r\n")
        t0 = time.monotonic()
        for s in socks[:CAP]:  # every held one is closed after the head timeout
            assert read_to_eof(s, 10.0) == b""
        assert time.monotonic() - t0 < HEAD_S + 5
        # the driver goes on: a checkpoint record is written, requests are answered
        assert runner(coord, 1, client).run_batch(0, ROWS) is not None
        assert coord.storage.batch_ids() == [0]
        status, _, doc = http(rest, "GET", "/jobs/idle/checkpoints/config")
        assert status == 200 and isinstance(doc, dict) and doc["jobId"] == "idle"
    finally:
        for s in socks:
            s.close()
        coord.close()


def test_limits_have_documented_defaults_and_are_checked() -> None:
    assert DEFAULT_MAX_CONNECTIONS == 64 and DEFAULT_HEAD_TIMEOUT_S == 5.0
    for kw in ({"max_connections": 0}, {"head_timeout_s": 0.0}, {"head_timeout_s": 1e9}):
        with pytest.raises(ConfigError):
            CheckpointConfigServer(**kw)  # type: ignore[arg-type]
