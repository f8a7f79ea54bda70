"""How each fault of a schedule is done to the processes of a round.

Helpers for :mod:`loadtest.chaos_bench.runner` (its loop thread only):
the S3 view through the fault proxy, a sidecar started again on the address
of the one killed, an executor's processes found and killed, and the
proxy's configuration for the S3 windows open now.
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections.abc import Iterable

import psutil

from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.chaos_bench.schedule import Fault, FaultKind
from loadtest.s3fault import FaultConfig, LatencySpec
from loadtest.spark_cluster import Node

EXECUTOR_MAIN = "CoarseGrainedExecutorBackend"
PYTHON_WORKERS = ("pyspark.daemon", "pyspark.worker")


def through_proxy(s3: SeaweedS3, proxy_url: str) -> SeaweedS3:
    """A view of the running ``s3`` whose endpoint is the fault proxy at ``proxy_url``.

    Every process configured from it (sidecars: ``server_args()``; drivers:
    ``endpoint_url``) talks S3 through the proxy, with the same bucket and
    credentials. The view shares the server; it must not be started or
    stopped (the original owns the ``weed`` process).
    """
    view = copy.copy(s3)
    view.endpoint_url = proxy_url
    return view


def sidecar_again(killed: ServerProcess, s3: SeaweedS3) -> ServerProcess:
    """A new sidecar on the address of ``killed`` (its clients keep their address), with a
    root of its own next to the old one; started. Raises if it cannot bind or start."""
    fresh = ServerProcess(
        killed.root.parent / f"{killed.root.name.split('+')[0]}+{time.monotonic_ns()}",
        storage=killed.storage,
        extra_args=s3.server_args(),
        env=s3.env(),
        listen=killed.address,
    )
    return fresh.start()


def _group_members(node: Node) -> list[psutil.Process]:
    """Processes in the process group of the node's worker (its executors, their Python)."""
    if node.worker is None or node.worker.poll() is not None:
        return []
    group = node.worker.pid
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != group and os.getpgid(p.pid) == group:
                out.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return out


def kill_executors(node: Node) -> int:
    """SIGKILL the node's executor JVMs and their Python workers (not its worker, not its
    sidecar); the worker starts a new executor. Returns the executors killed (0: none ran)."""
    members = _group_members(node)
    executors = [p for p in members if EXECUTOR_MAIN in " ".join(p.info["cmdline"] or ())]
    if not executors:
        return 0
    victims = executors + [
        p
        for p in members
        if any(w in part for part in p.info["cmdline"] or () for w in PYTHON_WORKERS)
    ]
    for p in victims:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return len(executors)


def proxy_faults(windows: Iterable[Fault]) -> FaultConfig:
    """The proxy's configuration while ``windows`` are open: their 503 and reset rates add
    up (capped so that some requests pass), the longest stall applies."""
    e503 = reset = stall_rate = 0.0
    stall_ms = 0
    reset_phase = stall_phase = "request"
    for w in windows:
        if w.kind is FaultKind.S3_503:
            e503 += w.rate
        elif w.kind is FaultKind.S3_RESET:
            reset += w.rate
            reset_phase = w.phase if w.phase == "response" else reset_phase
        elif w.kind is FaultKind.S3_STALL:
            stall_rate = max(stall_rate, w.rate)
            stall_ms = max(stall_ms, w.stall_ms)
            stall_phase = w.phase if w.phase == "response" else stall_phase
    scale = min(1.0, 0.6 / (e503 + reset)) if e503 + reset > 0 else 1.0
    return FaultConfig(
        latency=LatencySpec(rate=stall_rate, dist="fixed", ms=float(stall_ms)),
        error_503_rate=round(e503 * scale, 4),
        reset_rate=round(reset * scale, 4),
        latency_phase=stall_phase,
        reset_phase=reset_phase,
    )
