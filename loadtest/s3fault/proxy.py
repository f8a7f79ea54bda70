"""The fault proxy as an in-process aiohttp server (:class:`S3FaultProxy`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from loadtest.s3fault.config import FaultConfig, FaultConfigError
from loadtest.s3fault.stats import ProxyStats, s3_operation

#: headers that belong to one connection, never forwarded
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",  # recomputed from the forwarded body (same bytes, same length)
    }
)
MAX_BODY_BYTES = 1 << 30


def _error_xml(code: str, message: str, resource: str, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()


class S3FaultProxy:
    """The proxy as an in-process aiohttp server (see the module docstring).

    ``async with S3FaultProxy(upstream) as proxy:`` listens on ``proxy.url``
    (a free port on ``host`` unless ``port`` is given). :attr:`faults` may be
    replaced at any time (:meth:`set_faults`); each request reads the
    configuration in force when it arrives. ``seed`` makes the fault draws
    reproducible for a given request order.

    Event-loop only: start, stop, :meth:`set_faults` and :attr:`stats` are
    used from tasks of the loop it serves on (from another thread, drive it
    over its control endpoints, as :class:`~loadtest.s3fault.FaultProxyProcess`
    does). A request is answered, faulted or reset exactly once; the upstream
    sees a request only if no request-phase fault was drawn for it.
    """

    def __init__(
        self,
        upstream: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultConfig | None = None,
        seed: int | None = None,
        max_connections: int = 512,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.port = port
        self.faults = faults or FaultConfig()
        self.stats = ProxyStats()
        self._rng = random.Random(seed)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The endpoint to give S3 clients (``http://host:port``)."""
        return f"http://{self.host}:{self.port}"

    def set_faults(self, faults: FaultConfig | Mapping[str, Any]) -> None:
        self.faults = faults if isinstance(faults, FaultConfig) else FaultConfig.from_dict(faults)

    # ---------------------------------------------------------- lifecycle
    async def start(self) -> S3FaultProxy:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._max_connections, force_close=False),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
        )
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/__fault__", self._get_faults)
        app.router.add_post("/__fault__", self._post_faults)
        app.router.add_get("/__stats__", self._get_stats)
        app.router.add_post("/__stats__/reset", self._reset_stats)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        # On stop, requests still held by an injected delay are dropped after a second.
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> S3FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------ control
    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.to_dict())

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            raw = await request.json()
            self.set_faults(raw)
        except (FaultConfigError, json.JSONDecodeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(self.faults.to_dict())

    async def _get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.snapshot())

    async def _reset_stats(self, request: web.Request) -> web.Response:
        self.stats.reset()
        return web.json_response(self.stats.snapshot())

    # -------------------------------------------------------------- proxy
    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        st = self.stats
        st.requests += 1
        st.in_flight += 1
        try:
            return await self._handle(request)
        finally:
            st.in_flight -= 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        st = self.stats
        cfg = self.faults
        method = request.method
        op = s3_operation(method, request.query)
        st.by_method[method] += 1
        st.by_op[op] += 1
        body = await request.read()

        delay_s = 0.0
        failure = ""
        if cfg.applies_to(method):
            r = self._rng.random()
            if r < cfg.reset_rate:
                failure = "reset"
            elif r < cfg.reset_rate + cfg.error_503_rate:
                failure = "503"
            elif r < cfg.reset_rate + cfg.error_503_rate + cfg.error_500_rate:
                failure = "500"
            if cfg.latency.rate > 0 and self._rng.random() < cfg.latency.rate:
                delay_s = cfg.latency.draw_ms(self._rng) / 1000.0
                st.fault("latency", op)
        if failure:
            st.fault(failure, op)

        if delay_s and (cfg.latency_phase == "request" or failure in ("503", "500")):
            await asyncio.sleep(delay_s)
            delay_s = 0.0
        if failure == "reset" and cfg.reset_phase == "request":
            return self._reset(request)
        if failure in ("503", "500"):
            return self._error(request, failure)

        try:
            status, reason, headers, resp_body = await self._forward(request, body)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            st.upstream_errors += 1
            return self._error(request, "502", detail=f"{type(exc).__name__}: {exc}")
        st.forwarded += 1
        if delay_s:
            await asyncio.sleep(delay_s)
        if failure == "reset":  # response phase: the upstream did the work
            return self._reset(request)
        out = web.StreamResponse(status=status, reason=reason)
        for k, v in headers:
            if k.lower() not in _HOP_BY_HOP:
                out.headers.add(k, v)
        if method == "HEAD":
            length = next((v for k, v in headers if k.lower() == "content-length"), None)
            if length is not None:
                out.headers["Content-Length"] = length
        else:
            out.content_length = len(resp_body)
        await out.prepare(request)
        if resp_body and method != "HEAD":
            await out.write(resp_body)
        await out.write_eof()
        return out

    async def _forward(
        self, request: web.Request, body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        assert self._session is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        url = URL(self.upstream + request.raw_path, encoded=True)
        async with self._session.request(
            request.method,
            url,
            headers=headers,
            data=body if body or request.method in ("PUT", "POST") else None,
            allow_redirects=False,
        ) as resp:
            data = await resp.read()
            return resp.status, resp.reason or "", list(resp.headers.items()), data

    def _error(self, request: web.Request, kind: str, detail: str = "") -> web.Response:
        code, status, message = {
            "503": ("SlowDown", 503, "Please reduce your request rate."),
            "500": ("InternalError", 500, "We encountered an internal error. Please try again."),
            "502": ("BadGateway", 502, f"fault proxy could not reach the upstream: {detail}"),
        }[kind]
        request_id = uuid.uuid4().hex[:16].upper()
        body = (
            b"" if request.method == "HEAD" else _error_xml(code, message, request.path, request_id)
        )
        return web.Response(
            status=status,
            body=body,
            content_type="application/xml",
            headers={"x-amz-request-id": request_id},
        )

    def _reset(self, request: web.Request) -> web.Response:
        """Drop the connection with a TCP RST (SO_LINGER 0, then abort)."""
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        # Nothing reaches the client; aiohttp notices the closed transport.
        return web.Response(status=503)
