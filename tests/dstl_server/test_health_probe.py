"""``dstl-server health``: the exec probe, against real ``dstl-server`` processes.

It speaks h2c with the standard library only (dstl_server/health_probe.py),
so these tests run the real command over a Unix socket and loopback TCP:
SERVING exits 0, a stopped server, an unknown service, a server that never
answers and a Changelog service NOT_SERVING (its store is down) exit 1. One
test checks what the command imports: nothing of grpcio or protobuf.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstl_server import health_probe
from dstl_server.health_probe import CHANGELOG_SERVICE, default_address, parse_status
from dstl_server.testing import ServerProcess


def health(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``dstl-server health ARGS`` as a process (``python -m dstl_server`` is dstl-server)."""
    return subprocess.run(
        [sys.executable, "-m", "dstl_server", "health", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_serving_is_0_and_a_stopped_server_is_1(tmp_path: Path) -> None:
    sock = tmp_path / "dstl.sock"
    with ServerProcess(tmp_path / "srv", unix_socket=str(sock)) as server:
        for address in (f"unix://{sock}", server.address):
            for service in ("", CHANGELOG_SERVICE):
                result = health("--address", address, "--service", service)
                assert (result.returncode, result.stdout.strip()) == (0, "SERVING"), result.stderr
        unknown = health("--address", server.address, "--service", "no.such.Service")
        assert unknown.returncode == 1
        assert "no.such.Service" in unknown.stderr and "no status" in unknown.stderr
        assert server.stop() == 0
    for address in (f"unix://{sock}", server.address):
        result = health("--address", address)
        assert result.returncode == 1
        assert result.stderr.startswith(f"dstl-server health: {address} (overall): ")


@pytest.mark.slow
def test_changelog_not_serving_while_the_store_is_down_is_1(tmp_path: Path) -> None:
    """Readiness fails, liveness passes: nothing listens at the S3 endpoint."""
    env = {
        "AWS_ACCESS_KEY_ID": "dummy",
        "AWS_SECRET_ACCESS_KEY": "dummy",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    endpoint = f"http://127.0.0.1:{_free_port()}"
    with ServerProcess(
        tmp_path / "srv",
        storage="s3://bucket/prefix",
        env=env,
        extra_args=["--s3-endpoint-url", endpoint],
    ) as server:
        assert not server.store_up
        ready = health("--address", server.address, "--service", CHANGELOG_SERVICE)
        assert ready.returncode == 1
        assert ready.stderr.strip().endswith(f"service '{CHANGELOG_SERVICE}': NOT_SERVING")
        alive = health("--address", server.address)
        assert alive.returncode == 0, alive.stderr


def test_a_server_that_never_answers_fails_within_the_timeout() -> None:
    with socket.socket() as silent:  # accepts (backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = health("--address", address, "--timeout", "0.5")
        assert result.returncode == 1
        assert "no answer in time" in result.stderr
        assert time.monotonic() - started < 20  # the interpreter's start included


def test_the_probe_imports_no_grpc() -> None:
    """What the chart runs every few seconds: an interpreter and the standard library."""
    code = (
        "import sys\n"
        "from dstl_server.cli import main\n"
        "code = main(['health', '--address', 'unix:///nonexistent/dstl.sock'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('grpc', 'google', 'dstl_client', 'prometheus_client', 'uvloop', 'boto3', 'aiobotocore'))\n"
        "print(code, heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == "1 []"


def test_bad_flags_are_2() -> None:
    assert health("--timeout", "0").returncode == 2
    assert health("--serv", CHANGELOG_SERVICE).returncode == 2  # no abbreviations


def test_parse_status_and_the_request_encoding() -> None:
    assert parse_status(b"\x00\x00\x00\x00\x02\x08\x01") == 1  # status: SERVING
    assert parse_status(b"\x00\x00\x00\x00\x02\x08\x02") == 2
    assert parse_status(b"\x00\x00\x00\x00\x00") == 0  # proto3: absent is UNKNOWN
    assert parse_status(b"") is None  # an error answer carries no message
    with pytest.raises(health_probe.ProbeError):
        parse_status(b"\x00\x00\x00\x00\x05\x08")  # cut short
    # a service name past HPACK's 7-bit prefix and protobuf's one-byte varint
    long_name = "x" * 300
    sent = health_probe.request_bytes(long_name, "localhost", 1.0)
    assert sent.endswith(b"\x0a\xac\x02" + long_name.encode())
    assert health_probe._hpack_int(300, 7) == b"\x7f\xad\x01"


def test_default_address_is_the_sidecars_own() -> None:
    assert default_address({"DSTL_UNIX_SOCKET": "/run/dstl/s.sock"}) == "unix:///run/dstl/s.sock"
    assert default_address({"DSTL_LISTEN": "0.0.0.0:7171"}) == "127.0.0.1:7171"
    assert default_address({"DSTL_LISTEN": "[::]:7171"}) == "[::1]:7171"
    assert default_address({}) == "127.0.0.1:7070"
