"""``dstl-server health``: one ``grpc.health.v1`` Check, exit 0 when SERVING, else 1.

What the chart's exec probes run, every 2-20 s inside the sidecar's memory
limit, so it imports nothing but the standard library (no grpcio, no
protobuf: an interpreter of about 12 MiB RSS instead of 40 MiB): it speaks
just enough clear-text HTTP/2 (h2c, RFC 9113) to send one unary gRPC call
over a Unix socket or TCP and read its answer. The request's headers are
HPACK literals without indexing (no table, no Huffman: any decoder takes
them); the answer's headers are never decoded, only the response message
(``HealthCheckResponse.status``, field 1) is. An error answer (an unknown
service: NOT_FOUND) carries no message and reads as "no status": exit 1.

Clear text only: the Unix socket, or a TCP listener without TLS (the chart
probes a TLS-only listener with ``tcpSocket``). Health checks need no token.
Every wait is bounded by ``--timeout``; every frame by the 16 KiB frame size
HTTP/2 allows by default, and the whole answer by :data:`MAX_ANSWER_BYTES`.

This module must stay importable without the rest of the package's
dependencies: ``dstl-server health`` dispatches here before
``dstl_server.cli`` imports anything else (tests/dstl_server/test_health_probe.py
checks the imported modules).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence

SERVING = 1
#: HealthCheckResponse.ServingStatus names, by number
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
#: the overall health (liveness); readiness asks for this service
CHANGELOG_SERVICE = "dstl.v1.Changelog"
_PATH = "/grpc.health.v1.Health/Check"
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types and flags (RFC 9113, 6)
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
_END_STREAM, _ACK, _END_HEADERS, _PADDED = 0x1, 0x1, 0x4, 0x8
#: SETTINGS_MAX_FRAME_SIZE's initial value: we announce no other, so no frame is larger
_MAX_FRAME = 16384
#: the answer is a few bytes; more than this is not a health server
MAX_ANSWER_BYTES = 64 * 1024
_STREAM = 1


class ProbeError(Exception):
    """The check got no answer it can read (connection, protocol, timeout)."""


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK integer (RFC 7541, 5.1) with ``first``'s high bits in the first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_literal(name: str, value: str) -> bytes:
    """A header as "literal without indexing, new name" (RFC 7541, 6.2.2), no Huffman."""
    out = bytearray(b"\x00")
    for text in (name.encode(), value.encode()):
        out += _hpack_int(len(text), 7) + text
    return bytes(out)


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def request_bytes(service: str, authority: str, timeout_s: float) -> bytes:
    """Everything the client sends: preface, SETTINGS, HEADERS and the one DATA frame."""
    headers = b"".join(
        _hpack_literal(name, value)
        for name, value in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", _PATH),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", f"{max(1, int(timeout_s * 1000))}m"),
        )
    )
    name = service.encode()
    message = b"\x0a" + _varint(len(name)) + name if name else b""  # HealthCheckRequest.service
    body = b"\x00" + struct.pack(">I", len(message)) + message  # gRPC length-prefixed message
    return (
        _PREFACE
        + _frame(_SETTINGS, 0, 0)
        + _frame(_HEADERS, _END_HEADERS, _STREAM, headers)
        + _frame(_DATA, _END_STREAM, _STREAM, body)
    )


def parse_status(data: bytes) -> int | None:
    """``HealthCheckResponse.status`` from the gRPC-framed answer; None without a message."""
    if len(data) < 5:
        return None
    compressed, length = data[0], struct.unpack(">I", data[1:5])[0]
    message = data[5 : 5 + length]
    if compressed or len(message) != length:
        raise ProbeError("the answer is compressed or cut short")
    status, i = 0, 0  # proto3: an absent field is 0 (UNKNOWN)
    while i < len(message):
        key, i = _read_varint(message, i)
        field, wire = key >> 3, key & 0x7
        if wire == 0:
            value, i = _read_varint(message, i)
            if field == 1:
                status = value
        elif wire == 2:
            size, i = _read_varint(message, i)
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ProbeError(f"the answer is not a HealthCheckResponse (wire type {wire})")
    if i != len(message):
        raise ProbeError("the answer is not a HealthCheckResponse (cut short)")
    return status


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ProbeError("the answer is not a HealthCheckResponse (bad varint)")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _connect(address: str, timeout_s: float) -> tuple[socket.socket, str]:
    """A connected socket for ``unix:///path``, ``unix:path``, ``host:port`` or ``[v6]:port``."""
    if address.startswith("unix:"):
        path = address[len("unix://") :] if address.startswith("unix://") else address[5:]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return sock, "localhost"
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ProbeError(f"address {address!r}: expected unix:///path or host:port")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s), address


def check(address: str, service: str = "", timeout_s: float = 5.0) -> int | None:
    """The serving status ``address`` reports for ``service`` ("" = the server overall).

    None when the server answered without a status (an unknown service).
    Raises :class:`ProbeError` or :class:`OSError` when there is no answer.
    """
    deadline = time.monotonic() + timeout_s
    sock, authority = _connect(address, timeout_s)
    with sock:
        sock.sendall(request_bytes(service, authority, timeout_s))
        data = bytearray()
        received = 0
        while True:
            header = _recv(sock, 9, deadline)
            length = int.from_bytes(header[:3], "big")
            kind, flags = header[3], header[4]
            stream = struct.unpack(">I", header[5:9])[0] & 0x7FFFFFFF
            received += 9 + length
            if length > _MAX_FRAME or received > MAX_ANSWER_BYTES:
                raise ProbeError("the answer is larger than a health answer can be")
            payload = _recv(sock, length, deadline)
            if kind == _SETTINGS and not flags & _ACK:
                sock.sendall(_frame(_SETTINGS, _ACK, 0))
            elif kind == _PING and not flags & _ACK:
                sock.sendall(_frame(_PING, _ACK, 0, payload))
            elif kind == _GOAWAY and struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF < _STREAM:
                raise ProbeError("the server is going away (shutting down) and took no call")
            elif stream == _STREAM and kind == _RST_STREAM:
                code = struct.unpack(">I", payload[:4])[0] if len(payload) >= 4 else -1
                raise ProbeError(f"the server reset the call (HTTP/2 error {code})")
            elif stream == _STREAM and kind == _DATA:
                if flags & _PADDED and payload:
                    payload = payload[1 : len(payload) - payload[0]]
                data += payload
            if stream == _STREAM and kind in (_DATA, _HEADERS) and flags & _END_STREAM:
                with contextlib.suppress(OSError):  # the answer is in; the goodbye is optional
                    sock.sendall(_frame(_GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
                return parse_status(bytes(data))


def _recv(sock: socket.socket, n: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in time")
        sock.settimeout(left)
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ProbeError("the server closed the connection before answering")
        out += chunk
    return bytes(out)


def default_address(environ: dict[str, str] | None = None) -> str:
    """The sidecar's own address from its DSTL_* variables: the Unix socket, else TCP."""
    env = os.environ if environ is None else environ
    sock = env.get("DSTL_UNIX_SOCKET", "").strip()
    if sock:
        return f"unix://{sock}"
    listen = env.get("DSTL_LISTEN", "").strip() or "127.0.0.1:7070"
    host, _, port = listen.rpartition(":")
    # a wildcard bind is reached on loopback
    host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}.get(host, host)
    return f"{host}:{port}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dstl-server health",
        allow_abbrev=False,
        description="Ask a dstl-server for its gRPC health (grpc.health.v1 Check, clear text, "
        "no token needed); exit 0 when SERVING, 1 otherwise. For exec probes: it imports "
        "only the standard library.",
    )
    parser.add_argument(
        "--address",
        help="unix:///path/to.sock or host:port (no TLS); default: the sidecar's own, from "
        "DSTL_UNIX_SOCKET, else DSTL_LISTEN (a wildcard bind on loopback)",
    )
    parser.add_argument(
        "--service",
        default="",
        help=f"the service to ask for: '' (default) the server overall (liveness), "
        f"{CHANGELOG_SERVICE} readiness (NOT_SERVING while the store does not answer or "
        "once shutdown started)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="give up after this long (default 5)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Exit code: 0 SERVING, 1 anything else (one line on stderr says what), 2 bad flags."""
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if not 0 < ns.timeout <= 3600:
        print("dstl-server health: --timeout must be above 0 and at most 3600", file=sys.stderr)
        return 2
    address = ns.address or default_address()
    what = f"{address} service {ns.service!r}" if ns.service else f"{address} (overall)"
    try:
        status = check(address, ns.service, ns.timeout)
    except (ProbeError, OSError) as exc:
        reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
        print(f"dstl-server health: {what}: {reason}", file=sys.stderr)
        return 1
    if status == SERVING:
        print("SERVING")
        return 0
    name = "no status (unknown service?)" if status is None else STATUS_NAMES.get(status, status)
    print(f"dstl-server health: {what}: {name}", file=sys.stderr)
    return 1
