"""One benchmark run: start the server, run the phases, assemble the report."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from dstl_server.settings import ServerSettings
from dstl_server.testing import ServerProcess
from loadtest.bench.append import append_phase
from loadtest.bench.checkpoint import checkpoint_phase
from loadtest.bench.config import BenchConfig, BenchError
from loadtest.bench.goals import targets
from loadtest.bench.measure import say
from loadtest.bench.rpc import rpc_phase
from loadtest.bench.target import BenchTarget
from loadtest.probe import sampling_rss


class Bench:
    """One benchmark run against one server process under ``root``.

    :meth:`run` is called once, from the main thread; it raises
    :class:`BenchError` when a writer or the server failed (no figures then).
    """

    def __init__(self, cfg: BenchConfig, root: Path) -> None:
        self.cfg = cfg
        self.root = root
        self.upload_slots = ServerSettings().max_concurrent_uploads

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.monotonic()
        extra = [
            "--persist-delay-ms",
            str(cfg.persist_delay_ms),
            "--fsync" if cfg.fsync else "--no-fsync",
            "--log-level",
            "WARNING",
        ]
        with ServerProcess(self.root / "server", extra_args=extra) as server:
            assert server.proc is not None
            say(f"server pid {server.proc.pid} at {server.address}, objects under {self.root}")
            with sampling_rss(server.proc.pid) as rss:
                t = BenchTarget(cfg, self.root, server, rss, self.upload_slots)
                idle_rss = int(psutil.Process(server.proc.pid).memory_info().rss)
                rpc = rpc_phase(t, cfg.rpc_calls)
                append = [
                    append_phase(t, "small", cfg.small_change_bytes),
                    append_phase(t, "large", cfg.large_change_bytes),
                ]
                checkpoint = [checkpoint_phase(t, w) for w in cfg.writer_counts]
                peak = rss.peak()
            code = server.stop()
            if code != 0:
                raise BenchError(f"dstl-server exited with code {code} on SIGTERM")
        report: dict[str, Any] = {
            "version": 1,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": round(time.monotonic() - t0, 1),
            "command": " ".join(["python -m loadtest.bench", *sys.argv[1:]]),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "config": asdict(cfg),
            "rpc": rpc,
            "append": append,
            "checkpoint": checkpoint,
            "memory": {
                "idle_rss_bytes": idle_rss,
                "peak_rss_bytes": peak,
                "max_in_flight_bytes": ServerSettings().max_in_flight_bytes,
                "flat": all(a["rss"]["flat"] for a in append),
            },
        }
        report["targets"] = targets(report)
        return report
