"""An S3 fault-injection proxy (aiohttp) for tests and benchmarks.

It sits between an S3 client (the sidecar) and a real S3 server (SeaweedFS)
and forwards every request byte for byte: method, raw path and query, body and
every header but the hop-by-hop ones, *including Host*, so SigV4 signatures
still verify upstream. Per request, at the configured rates, it:

* adds latency drawn from a distribution (``fixed``, ``uniform``,
  ``lognormal`` or ``pareto``, optionally capped), before forwarding (the
  object lands late) or after (the response comes late);
* answers ``503 SlowDown`` or ``500 InternalError`` with an S3 XML error body
  without forwarding;
* resets the connection (TCP RST), before forwarding or after the upstream
  has processed the request (the client cannot tell whether it happened).

Faults can be limited to some HTTP methods (e.g. only ``PUT``). They change
while running: ``POST /__fault__`` with a JSON :class:`FaultConfig` replaces
them (``{}`` clears them), ``GET /__fault__`` reads them. ``GET /__stats__``
returns counters of requests (by method and S3 operation) and of injected
faults; ``POST /__stats__/reset`` zeroes them.

Use it in-process (:class:`S3FaultProxy`, an async context manager), as a
child process (:class:`FaultProxyProcess`), or from a shell::

    python -m loadtest.s3fault --listen 127.0.0.1:0 --upstream http://127.0.0.1:8333 \\
        --faults '{"error_503_rate": 0.1, "methods": ["PUT"]}'

which prints ``READY url=http://127.0.0.1:PORT`` once it listens.

Only plain HTTP is spoken on both sides. A failure to reach the upstream is
answered with ``502`` (S3 error XML, code ``BadGateway``) and counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from dstl_server.testing import stop_process

__all__ = ["FaultConfig", "FaultProxyProcess", "LatencySpec", "S3FaultProxy"]

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
_DISTS = ("fixed", "uniform", "lognormal", "pareto")
_PHASES = ("request", "response")
MAX_BODY_BYTES = 1 << 30


class FaultConfigError(ValueError):
    """A fault configuration that does not validate."""


def _rate(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise FaultConfigError(f"{name} must be a number, got {value!r}") from None
    if not 0.0 <= v <= 1.0:
        raise FaultConfigError(f"{name} must be between 0 and 1, got {v}")
    return v


def _nonneg(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise FaultConfigError(f"{name} must be a number, got {value!r}") from None
    if v < 0 or not math.isfinite(v):
        raise FaultConfigError(f"{name} must be >= 0, got {v}")
    return v


@dataclass(frozen=True, slots=True)
class LatencySpec:
    """Extra latency for a fraction ``rate`` of requests.

    ``dist``: ``fixed`` (``ms``), ``uniform`` (``min_ms``..``max_ms``),
    ``lognormal`` (``median_ms``, ``sigma``) or ``pareto`` (scale ``min_ms``,
    shape ``alpha``). For ``lognormal`` and ``pareto`` a ``max_ms`` > 0 caps
    the draw.
    """

    rate: float = 0.0
    dist: str = "fixed"
    ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    median_ms: float = 0.0
    sigma: float = 1.0
    alpha: float = 1.5

    def __post_init__(self) -> None:
        _rate("latency.rate", self.rate)
        if self.dist not in _DISTS:
            raise FaultConfigError(f"latency.dist must be one of {_DISTS}, got {self.dist!r}")
        for name in ("ms", "min_ms", "max_ms", "median_ms", "sigma", "alpha"):
            _nonneg(f"latency.{name}", getattr(self, name))
        if self.dist == "uniform" and self.max_ms < self.min_ms:
            raise FaultConfigError("latency.max_ms must be >= latency.min_ms for uniform")
        if self.dist == "pareto" and (self.alpha <= 0 or self.min_ms <= 0):
            raise FaultConfigError("pareto latency needs alpha > 0 and min_ms > 0")

    def draw_ms(self, rng: random.Random) -> float:
        """One latency sample in milliseconds."""
        if self.dist == "fixed":
            return self.ms
        if self.dist == "uniform":
            return rng.uniform(self.min_ms, self.max_ms)
        if self.dist == "lognormal":
            v = self.median_ms * math.exp(rng.gauss(0.0, self.sigma))
        else:
            v = self.min_ms * rng.paretovariate(self.alpha)
        return min(v, self.max_ms) if self.max_ms > 0 else v


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """What the proxy does to requests (every rate is a probability in 0..1).

    Each request that ``methods`` selects (all when empty) draws once:
    ``reset_rate``, then ``error_503_rate``, then ``error_500_rate`` decide a
    failure (these three are exclusive; their sum must be <= 1); independently
    ``latency.rate`` adds a delay (also before a failure answer).
    ``latency_phase``/``reset_phase``: ``request`` acts before forwarding,
    ``response`` after the upstream answered.
    """

    latency: LatencySpec = field(default_factory=LatencySpec)
    error_503_rate: float = 0.0
    error_500_rate: float = 0.0
    reset_rate: float = 0.0
    methods: tuple[str, ...] = ()
    latency_phase: str = "request"
    reset_phase: str = "request"

    def __post_init__(self) -> None:
        total = 0.0
        for name in ("error_503_rate", "error_500_rate", "reset_rate"):
            total += _rate(name, getattr(self, name))
        if total > 1.0 + 1e-9:
            raise FaultConfigError(f"error_503_rate + error_500_rate + reset_rate = {total} > 1")
        for name in ("latency_phase", "reset_phase"):
            if getattr(self, name) not in _PHASES:
                raise FaultConfigError(f"{name} must be one of {_PHASES}")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FaultConfig:
        """Build from JSON-like data; unknown keys are an error (typos must not pass)."""
        if not isinstance(raw, Mapping):
            raise FaultConfigError("the fault configuration must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise FaultConfigError(f"unknown fault settings: {sorted(unknown)}")
        values = dict(raw)
        lat = values.pop("latency", None) or {}
        if not isinstance(lat, Mapping):
            raise FaultConfigError("latency must be an object")
        lat_known = {f.name for f in fields(LatencySpec)}
        if set(lat) - lat_known:
            raise FaultConfigError(f"unknown latency settings: {sorted(set(lat) - lat_known)}")
        methods = values.pop("methods", ()) or ()
        if isinstance(methods, str) or not all(isinstance(m, str) for m in methods):
            raise FaultConfigError("methods must be a list of HTTP method names")
        try:
            return cls(
                latency=LatencySpec(**lat),
                methods=tuple(m.upper() for m in methods),
                **values,
            )
        except TypeError as exc:
            raise FaultConfigError(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["methods"] = list(self.methods)
        return d

    def applies_to(self, method: str) -> bool:
        return not self.methods or method.upper() in self.methods


def s3_operation(method: str, query: Mapping[str, str]) -> str:
    """Coarse S3 operation name of a request, for the stats."""
    if method == "POST" and "delete" in query:
        return "DeleteObjects"
    if method == "GET" and ("list-type" in query or "prefix" in query or "delimiter" in query):
        return "ListObjects"
    if method == "POST" and "uploads" in query:
        return "CreateMultipartUpload"
    if method == "PUT" and "partNumber" in query:
        return "UploadPart"
    return {
        "PUT": "PutObject",
        "GET": "GetObject",
        "HEAD": "HeadObject",
        "DELETE": "DeleteObject",
    }.get(method, method)


def _error_xml(code: str, message: str, resource: str, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()


class _Stats:
    """Counters of one proxy (event-loop only)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.started = time.time()
        self.requests = 0
        self.in_flight = 0
        self.by_method: Counter[str] = Counter()
        self.by_op: Counter[str] = Counter()
        self.forwarded = 0
        self.upstream_errors = 0
        self.faults: Counter[str] = Counter()
        self.faults_by_op: Counter[str] = Counter()

    def fault(self, kind: str, op: str) -> None:
        self.faults[kind] += 1
        self.faults_by_op[f"{op}:{kind}"] += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "since": self.started,
            "requests": self.requests,
            "in_flight": self.in_flight,
            "forwarded": self.forwarded,
            "upstream_errors": self.upstream_errors,
            "by_method": dict(self.by_method),
            "by_op": dict(self.by_op),
            "faults": {k: self.faults.get(k, 0) for k in ("latency", "503", "500", "reset")},
            "faults_by_op": dict(self.faults_by_op),
        }


class S3FaultProxy:
    """The proxy as an in-process aiohttp server (see the module docstring).

    ``async with S3FaultProxy(upstream) as proxy:`` listens on ``proxy.url``
    (a free port on ``host`` unless ``port`` is given). :attr:`faults` may be
    replaced at any time (:meth:`set_faults`); each request reads the
    configuration in force when it arrives. ``seed`` makes the fault draws
    reproducible for a given request order.
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
        self.stats = _Stats()
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


class FaultProxyProcess:
    """The proxy as a child process (``python -m loadtest.s3fault``), driven over HTTP.

    ``with FaultProxyProcess(upstream) as proxy:`` starts it and waits for
    its ``READY`` line; :attr:`url` is the endpoint for S3 clients.
    :meth:`set_faults`, :meth:`faults`, :meth:`stats` and
    :meth:`reset_stats` talk to its control endpoints. Leaving the block
    always stops the process (SIGTERM, then SIGKILL).
    """

    def __init__(
        self,
        upstream: str,
        *,
        faults: FaultConfig | Mapping[str, Any] | None = None,
        seed: int | None = None,
        listen: str = "127.0.0.1:0",
        start_timeout_s: float = 20.0,
    ) -> None:
        self.upstream = upstream
        self.listen = listen
        self.seed = seed
        self.start_timeout_s = start_timeout_s
        initial = faults.to_dict() if isinstance(faults, FaultConfig) else dict(faults or {})
        FaultConfig.from_dict(initial)  # fail here, not in the child
        self._initial = initial
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self._stderr: Any = None

    def start(self) -> FaultProxyProcess:
        args = [
            sys.executable,
            "-m",
            "loadtest.s3fault",
            "--listen",
            self.listen,
            "--upstream",
            self.upstream,
            "--faults",
            json.dumps(self._initial),
        ]
        if self.seed is not None:
            args += ["--seed", str(self.seed)]
        # stderr goes to a file: a pipe nobody reads would stall a chatty proxy
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        line: list[str] = []

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            line.append(self.proc.stdout.readline())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if not line or not line[0].startswith("READY "):
            self._stderr.seek(0)
            err = self._stderr.read()[-2000:]
            self.stop()
            raise RuntimeError(f"fault proxy did not start: {err}")
        self.url = dict(p.split("=", 1) for p in line[0].split()[1:])["url"]
        return self

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def set_faults(self, faults: FaultConfig | Mapping[str, Any]) -> dict[str, Any]:
        """Replace the faults in force; returns them as the proxy now holds them."""
        raw = faults.to_dict() if isinstance(faults, FaultConfig) else dict(faults)
        FaultConfig.from_dict(raw)
        result: dict[str, Any] = self._call("POST", "/__fault__", raw)
        return result

    def faults(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/__fault__")
        return result

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/__stats__")
        return result

    def reset_stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/__stats__/reset", {})
        return result

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 10 s) and reap; idempotent."""
        stop_process(self.proc, 10.0)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> FaultProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------ CLI
async def _serve(
    upstream: str, host: str, port: int, faults: FaultConfig, seed: int | None
) -> None:
    proxy = S3FaultProxy(upstream, host=host, port=port, faults=faults, seed=seed)
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY url={proxy.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.s3fault",
        description="S3 fault-injection proxy: forwards byte for byte (SigV4 stays valid) and "
        "injects latency, 503/500 answers and connection resets at configured rates.",
    )
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port (port 0: any free)")
    parser.add_argument(
        "--upstream", required=True, help="the S3 endpoint, e.g. http://127.0.0.1:8333"
    )
    parser.add_argument("--faults", default="{}", help="initial faults as JSON (see FaultConfig)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault draws")
    ns = parser.parse_args(argv)
    host, _, port = ns.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error("--listen expects host:port")
    try:
        faults = FaultConfig.from_dict(json.loads(ns.faults))
    except (FaultConfigError, json.JSONDecodeError) as exc:
        parser.error(f"--faults: {exc}")
    asyncio.run(_serve(ns.upstream, host, int(port), faults, ns.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
