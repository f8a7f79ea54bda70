"""One hedge mode, measured: a fresh server through the fault proxy, the writers, the figures."""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from dstl_server.testing import ServerProcess, scrape_metrics
from dstl_server.testing_s3 import SeaweedS3
from loadtest.hedging_bench.config import LATENCY_MAX_US, WAIT_TIMEOUT_S, BenchConfig
from loadtest.hedging_bench.writers import WriterStats, process_main
from loadtest.s3fault import FaultProxyProcess


@dataclass(slots=True)
class ModeResult:
    """The figures of one mode: persist latency (after the warm-up) and what it cost.

    Built by :func:`run_mode` once the mode is over; plain data from then on.
    """

    mode: str
    hedge_delay: str
    persists: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    uploads: int
    failed_uploads: int
    put_requests: int
    delete_requests: int
    tail_faults: int
    hedges_started: int
    hedges_won: int
    hedges_skipped_budget: int
    retries: int
    losers_deleted: int
    hedge_delay_end_ms: float
    extra_put_pct: float
    extra_request_pct: float


def _delay_text(cfg: BenchConfig, mode: str) -> str:
    if mode == "off":
        return "-"
    if mode == "fixed":
        return f"{cfg.fixed_delay_ms:g} ms"
    return (
        f"p{cfg.hedge_quantile * 100:g} in "
        f"[{cfg.hedge_min_delay_ms:g}, {cfg.hedge_max_delay_ms:g}] ms"
    )


def run_mode(
    cfg: BenchConfig, mode: str, s3: SeaweedS3, proxy: FaultProxyProcess, root: Path
) -> ModeResult:
    """Measure ``mode``: a fresh server storing through ``proxy`` (faults reset to the
    configured tail, stats zeroed), every writer process, then the server's metrics
    and the proxy's request counts. Called from the main thread; raises if a writer failed."""
    proxy.set_faults(cfg.faults())
    with ServerProcess(
        root / mode,
        storage=s3.storage_url(f"bench-{mode}-{int(time.time())}"),
        extra_args=[
            "--s3-endpoint-url", proxy.url, "--s3-region", s3.region, *cfg.server_args(mode)
        ],
        env=s3.env(),
    ) as server:  # fmt: skip
        proxy.reset_stats()
        ctx = mp.get_context("spawn")
        results: Any = ctx.Queue()
        start = time.monotonic() + 3.0  # time for the processes to import and connect
        groups = [list(range(p, cfg.writers, cfg.processes)) for p in range(cfg.processes)]
        procs = [
            ctx.Process(
                target=process_main, args=(server.address, cfg, g, start, results), daemon=True
            )
            for g in groups
            if g
        ]
        for p in procs:
            p.start()
        stats: dict[int, WriterStats] = {}
        try:
            deadline = start + cfg.warmup_s + cfg.duration_s + WAIT_TIMEOUT_S
            while len(stats) < cfg.writers:
                i, raw = results.get(timeout=max(1.0, deadline - time.monotonic()))
                stats[i] = WriterStats(**raw)
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        errors = [s.error for s in stats.values() if s.error]
        if errors:
            raise RuntimeError(f"{len(errors)} writer(s) failed; first: {errors[0]}")
        time.sleep(0.5)  # late losers finish and are deleted before we count requests
        m = scrape_metrics(server.metrics_port)
        st = proxy.stats()
    hist = HdrHistogram(1, LATENCY_MAX_US, 3)
    for s in stats.values():
        for us in s.latencies_us:
            hist.record_value(min(us, LATENCY_MAX_US))
    uploads = int(m.get('dstl_uploads_total{result="ok"}', 0))
    failed = int(m.get('dstl_uploads_total{result="failed"}', 0))
    puts = int(st["by_op"].get("PutObject", 0))
    deletes = int(st["by_op"].get("DeleteObjects", 0)) + int(st["by_op"].get("DeleteObject", 0))
    made = max(1, uploads + failed)
    return ModeResult(
        mode=mode,
        hedge_delay=_delay_text(cfg, mode),
        persists=int(hist.get_total_count()),
        p50_ms=hist.get_value_at_percentile(50) / 1000,
        p99_ms=hist.get_value_at_percentile(99) / 1000,
        p999_ms=hist.get_value_at_percentile(99.9) / 1000,
        max_ms=hist.get_max_value() / 1000,
        uploads=uploads,
        failed_uploads=failed,
        put_requests=puts,
        delete_requests=deletes,
        tail_faults=int(st["faults"]["latency"]),
        hedges_started=int(m.get("dstl_hedges_started_total", 0)),
        hedges_won=int(m.get("dstl_hedges_won_total", 0)),
        hedges_skipped_budget=int(m.get("dstl_hedges_skipped_budget_total", 0)),
        retries=int(m.get("dstl_upload_retries_total", 0)),
        losers_deleted=int(m.get("dstl_upload_attempts_discarded_total", 0)),
        hedge_delay_end_ms=float(m.get("dstl_hedge_delay_seconds", 0.0)) * 1000,
        extra_put_pct=100.0 * (puts - made) / made,
        extra_request_pct=100.0 * (puts + deletes - made) / made,
    )
