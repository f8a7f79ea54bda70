"""The command line of the fault proxy (``python -m loadtest.s3fault``).

Prints ``READY url=http://HOST:PORT`` once it listens (what
:class:`~loadtest.s3fault.FaultProxyProcess` waits for) and serves until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Sequence

from loadtest.s3fault.config import FaultConfig, FaultConfigError
from loadtest.s3fault.proxy import S3FaultProxy


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
