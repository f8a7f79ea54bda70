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

Modules: :mod:`~loadtest.s3fault.config` (:class:`FaultConfig`,
:class:`LatencySpec`), :mod:`~loadtest.s3fault.stats` (counters),
:mod:`~loadtest.s3fault.proxy` (:class:`S3FaultProxy`),
:mod:`~loadtest.s3fault.process` (:class:`FaultProxyProcess`) and
:mod:`~loadtest.s3fault.cli`.
"""

from __future__ import annotations

from loadtest.s3fault.cli import main
from loadtest.s3fault.config import FaultConfig, FaultConfigError, LatencySpec
from loadtest.s3fault.process import FaultProxyProcess
from loadtest.s3fault.proxy import MAX_BODY_BYTES, S3FaultProxy
from loadtest.s3fault.stats import ProxyStats, s3_operation

__all__ = [
    "MAX_BODY_BYTES",
    "FaultConfig",
    "FaultConfigError",
    "FaultProxyProcess",
    "LatencySpec",
    "ProxyStats",
    "S3FaultProxy",
    "main",
    "s3_operation",
]
