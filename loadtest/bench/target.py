"""The server under test, as the phases see it: its address, metrics, CPU, RSS and objects."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

from dstl_server.testing import ServerProcess
from loadtest.bench.config import BenchConfig
from loadtest.probe import MetricsSnapshot, RssSampler, scrape


@dataclass(slots=True)
class BenchTarget:
    """One running ``dstl-server`` process and the RSS sampler watching it.

    Valid while the server runs (inside ``Bench.run``); used by the phases,
    one after another, from the benchmark's main thread.
    """

    cfg: BenchConfig
    root: Path
    server: ServerProcess
    rss: RssSampler
    #: the server's max_concurrent_uploads (the baseline writes as many at a time)
    upload_slots: int

    def scrape(self) -> MetricsSnapshot:
        return scrape(self.server.metrics_port)

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far (user + system)."""
        assert self.server.proc is not None
        t = psutil.Process(self.server.proc.pid).cpu_times()
        return float(t.user + t.system)

    def objects_dir(self, job_id: str) -> Path:
        return self.root / "server" / "objects" / job_id
