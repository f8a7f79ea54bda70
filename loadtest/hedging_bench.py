"""Hedging benchmark (``python -m loadtest.hedging_bench``; ``--quick`` for a smoke run).

One run, one real S3 server (SeaweedFS ``weed mini``) behind the fault proxy
(:mod:`loadtest.s3fault`) with a heavy tail: by default 2% of PUTs are held
1-2 s before they reach the store. For each hedge mode (``off``, ``fixed``,
``adaptive``) a fresh ``dstl-server`` process stores through the proxy and
64 writers checkpoint against it:

* writers run on threads in a few processes (one client per process, as
  PySpark workers would); each loops: append a few changes, ``persist_durably``
  and wait for the handle, now and then truncate (a materialization), think
  for a random 0-2x ``--think-ms``. Writers are not in lockstep, so the
  sidecar makes many uploads (one object per flush) and the tail of upload
  latency shows in the tail of persist latency.
* persist latency (call to handle, measured by the writer) after a warm-up
  goes into an HdrHistogram: p50/p99/p99.9/max per mode.
* the cost: PUT and DeleteObjects requests the proxy saw, against the
  uploads the sidecar made (its metrics). "extra PUTs" = PUTs beyond one per
  upload (hedges and retries); "extra requests" adds the deletes of losing
  attempts.

Goal (DESIGN.md section 6): p99.9 cut by at least half against ``off`` for at
most 5% extra requests. Prints a table and writes a JSON report to
``loadtest/reports/`` (``--report-dir``). Figures are what this run measured
on this machine; a shared 2-core box is noisy, so compare modes within a run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from dstl_client import ChangelogClient
from dstl_server.testing import ServerProcess, scrape_metrics
from dstl_server.testing_s3 import SeaweedS3
from loadtest.s3fault import FaultConfig, FaultProxyProcess

DEFAULT_REPORT_DIR = Path(__file__).resolve().parent / "reports"
MODES = ("off", "fixed", "adaptive")
TARGET_P999_CUT = 0.5
TARGET_EXTRA = 0.05
LATENCY_MAX_US = 3_600_000_000
WAIT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything a run depends on (recorded in the report)."""

    writers: int = 64
    processes: int = 4
    duration_s: float = 60.0
    warmup_s: float = 5.0
    changes_per_checkpoint: int = 4
    change_bytes: int = 1024
    think_ms: float = 50.0
    truncate_every: int = 10
    tail_rate: float = 0.02
    tail_min_ms: float = 1000.0
    tail_max_ms: float = 2000.0
    fixed_delay_ms: float = 200.0
    hedge_quantile: float = 0.95
    hedge_min_delay_ms: float = 50.0
    hedge_max_delay_ms: float = 2000.0
    hedge_budget_fraction: float = 0.05
    persist_delay_ms: float = 10.0
    modes: tuple[str, ...] = MODES
    seed: int = 42
    quick: bool = False

    def faults(self) -> FaultConfig:
        return FaultConfig.from_dict(
            {
                "latency": {
                    "rate": self.tail_rate,
                    "dist": "uniform",
                    "min_ms": self.tail_min_ms,
                    "max_ms": self.tail_max_ms,
                },
                "methods": ["PUT"],
            }
        )

    def server_args(self, mode: str) -> list[str]:
        return [
            "--hedge-mode", mode,
            "--hedge-delay-ms", str(self.fixed_delay_ms),
            "--hedge-quantile", str(self.hedge_quantile),
            "--hedge-min-delay-ms", str(self.hedge_min_delay_ms),
            "--hedge-max-delay-ms", str(self.hedge_max_delay_ms),
            "--hedge-budget-fraction", str(self.hedge_budget_fraction),
            "--persist-delay-ms", str(self.persist_delay_ms),
        ]  # fmt: skip


QUICK: dict[str, Any] = {"writers": 16, "processes": 2, "duration_s": 6.0, "warmup_s": 1.5}


# ------------------------------------------------------------------ writers
@dataclass(slots=True)
class WriterStats:
    persists: int = 0
    latencies_us: list[int] = field(default_factory=list)
    error: str | None = None


def _writer_loop(
    client: ChangelogClient, cfg: BenchConfig, index: int, start: float, out: WriterStats
) -> None:
    rng = random.Random(cfg.seed * 1000 + index)
    payload = [os.urandom(cfg.change_bytes) for _ in range(8)]
    measure_from = start + cfg.warmup_s
    end = measure_from + cfg.duration_s
    w = client.create_writer(
        job_id="hedging-bench", operator_id=f"op-{index}", key_group_range=(0, 127)
    )
    try:
        materialized = 0
        time.sleep(max(0.0, start - time.monotonic()) + rng.uniform(0, cfg.think_ms / 1000))
        while True:
            t_call = time.monotonic()
            if t_call >= end:
                break
            for _ in range(cfg.changes_per_checkpoint):
                w.append(rng.randrange(128), payload[rng.randrange(len(payload))])
            w.flush()  # the append RPC is not part of the persist latency
            t0 = time.perf_counter()
            handle = w.persist_durably(after=materialized).result(timeout=WAIT_TIMEOUT_S)
            us = int((time.perf_counter() - t0) * 1e6)
            out.persists += 1
            if t_call >= measure_from:
                out.latencies_us.append(max(1, us))
            if out.persists % cfg.truncate_every == 0:
                w.truncate(before=handle.to_sqn)
                materialized = handle.to_sqn
            time.sleep(rng.uniform(0, 2 * cfg.think_ms / 1000))
    finally:
        w.close()


def _process_main(
    target: str, cfg: BenchConfig, indexes: Sequence[int], start: float, results: Any
) -> None:
    """One writer process: a client, one thread per writer; puts one result per writer."""
    stats = {i: WriterStats() for i in indexes}
    with ChangelogClient(target) as client:

        def run(i: int) -> None:
            try:
                _writer_loop(client, cfg, i, start, stats[i])
            except BaseException as exc:
                stats[i].error = f"writer {i}: {exc!r}\n{traceback.format_exc(limit=4)}"

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in indexes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(cfg.warmup_s + cfg.duration_s + WAIT_TIMEOUT_S)
    for i in indexes:
        results.put((i, asdict(stats[i])))


# --------------------------------------------------------------------- modes
@dataclass(slots=True)
class ModeResult:
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
                target=_process_main, args=(server.address, cfg, g, start, results), daemon=True
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


# ------------------------------------------------------------------- report
def verdicts(results: Sequence[ModeResult]) -> dict[str, dict[str, Any]]:
    """Against ``off``: the p99.9 cut and the extra requests of each hedging mode."""
    base = next((r for r in results if r.mode == "off"), None)
    out: dict[str, dict[str, Any]] = {}
    if base is None or base.p999_ms <= 0:
        return out
    for r in results:
        if r.mode == "off":
            continue
        cut = 1.0 - r.p999_ms / base.p999_ms
        out[r.mode] = {
            "p999_cut_pct": round(100 * cut, 1),
            "extra_put_pct": round(r.extra_put_pct, 2),
            "extra_request_pct": round(r.extra_request_pct, 2),
            "goal_met_puts": cut >= TARGET_P999_CUT and r.extra_put_pct <= 100 * TARGET_EXTRA,
            "goal_met_all_requests": cut >= TARGET_P999_CUT
            and r.extra_request_pct <= 100 * TARGET_EXTRA,
        }
    return out


def table(results: Sequence[ModeResult], cfg: BenchConfig) -> str:
    head = (
        f"{'mode':<9} {'hedge delay':<24} {'persists':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p999 ms':>8} {'max ms':>7} {'uploads':>7} {'PUTs':>6} {'DELs':>5} "
        f"{'hedges (won/skip)':>17} {'extra PUTs':>10} {'extra req':>9}"
    )
    lines = [
        f"{cfg.writers} writers, {cfg.duration_s:g}s per mode; fault: {cfg.tail_rate:.0%} of PUTs "
        f"+{cfg.tail_min_ms:g}-{cfg.tail_max_ms:g} ms",
        head,
        "-" * len(head),
    ]
    for r in results:
        hedges = f"{r.hedges_started} ({r.hedges_won}/{r.hedges_skipped_budget})"
        delay = r.hedge_delay
        if r.mode == "adaptive":
            delay += f" ~{r.hedge_delay_end_ms:.0f}"
        lines.append(
            f"{r.mode:<9} {delay:<24} {r.persists:>8} {r.p50_ms:>7.1f} {r.p99_ms:>7.1f} "
            f"{r.p999_ms:>8.1f} {r.max_ms:>7.0f} {r.uploads:>7} {r.put_requests:>6} "
            f"{r.delete_requests:>5} {hedges:>17} {r.extra_put_pct:>9.2f}% "
            f"{r.extra_request_pct:>8.2f}%"
        )
    for mode, v in verdicts(results).items():
        lines.append(
            f"{mode}: p99.9 cut {v['p999_cut_pct']:.1f}% (goal >= {TARGET_P999_CUT:.0%}) for "
            f"{v['extra_put_pct']:.2f}% extra PUTs, {v['extra_request_pct']:.2f}% extra requests "
            f"with loser deletes (goal <= {TARGET_EXTRA:.0%}): "
            f"{'PASS' if v['goal_met_puts'] else 'MISS'} on PUTs, "
            f"{'PASS' if v['goal_met_all_requests'] else 'MISS'} on all requests"
        )
    return "\n".join(lines)


def run(cfg: BenchConfig, report_dir: Path) -> dict[str, Any]:
    results: list[ModeResult] = []
    root = Path(tempfile.mkdtemp(prefix="dstl-hedging-bench-"))
    with (
        SeaweedS3() as s3,
        FaultProxyProcess(s3.endpoint_url, faults=cfg.faults(), seed=cfg.seed) as proxy,
    ):
        for mode in cfg.modes:
            print(f"[hedging_bench] mode {mode} ...", file=sys.stderr, flush=True)
            results.append(run_mode(cfg, mode, s3, proxy, root))
    report = {
        "bench": "hedging",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
        },
        "config": asdict(cfg),
        "results": [asdict(r) for r in results],
        "verdicts": verdicts(results),
        "table": table(results, cfg),
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    name = f"hedging-{'quick-' if cfg.quick else ''}{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    path = report_dir / name
    path.write_text(json.dumps(report, indent=2) + "\n")
    report["path"] = str(path)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.hedging_bench",
        description="Persist latency under an injected heavy tail: hedging off / fixed / "
        "adaptive, and the extra requests each costs.",
    )
    d = BenchConfig()
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--writers", type=int, default=None, help=f"default {d.writers}")
    parser.add_argument("--processes", type=int, default=None, help=f"default {d.processes}")
    parser.add_argument("--duration", type=float, default=None, help="seconds measured per mode")
    parser.add_argument("--warmup", type=float, default=None, help="seconds before measuring")
    parser.add_argument(
        "--think-ms", type=float, default=None, help="mean pause between checkpoints"
    )
    parser.add_argument("--tail-rate", type=float, default=None, help="fraction of PUTs delayed")
    parser.add_argument("--tail-min-ms", type=float, default=None)
    parser.add_argument("--tail-max-ms", type=float, default=None)
    parser.add_argument("--fixed-delay-ms", type=float, default=None, help="fixed-mode hedge delay")
    parser.add_argument("--hedge-quantile", type=float, default=None, help="adaptive quantile")
    parser.add_argument("--hedge-budget-fraction", type=float, default=None)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    parser.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    ns = parser.parse_args(argv)
    cfg = replace(d, **QUICK, quick=True) if ns.quick else d
    overrides: dict[str, Any] = {
        "writers": ns.writers,
        "processes": ns.processes,
        "duration_s": ns.duration,
        "warmup_s": ns.warmup,
        "think_ms": ns.think_ms,
        "tail_rate": ns.tail_rate,
        "tail_min_ms": ns.tail_min_ms,
        "tail_max_ms": ns.tail_max_ms,
        "fixed_delay_ms": ns.fixed_delay_ms,
        "hedge_quantile": ns.hedge_quantile,
        "hedge_budget_fraction": ns.hedge_budget_fraction,
    }
    modes = tuple(m.strip() for m in ns.modes.split(",") if m.strip())
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: choose from {MODES}")
    cfg = replace(cfg, modes=modes, **{k: v for k, v in overrides.items() if v is not None})
    report = run(cfg, ns.report_dir)
    print(report["table"])
    print(f"report: {report['path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
