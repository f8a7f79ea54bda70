"""The dstl core benchmark (``make bench-core`` / ``python -m loadtest.bench``).

Starts a real ``dstl-server`` process on ``file://`` storage in a temporary
directory and drives it from several writer *processes* (each with its own
client, several writers per process on threads):

1. **append** -- writers append batches as fast as they can for
   ``--duration`` seconds, checkpointing every ``--checkpoint-interval`` and
   truncating every few checkpoints, with pre-emptive uploads on; once with
   small changes (the changes/s figure) and once with large ones (MB/s).
   Server RSS is sampled throughout. Baseline: the bytes the service stored,
   written straight to the same store in objects of the same size.
2. **checkpoint** -- for each writer count (1, 8, 64), rounds in lockstep:
   every writer appends ``--round-bytes``, then all persist together. Client
   persist latency goes into an HdrHistogram; objects per flush come from the
   server's metrics. Baseline: the store's own put latency for objects of the
   size the service wrote. "Added" latency at quantile q is
   ``persist(q) - persist delay - put(q)``.

Prints a table with PASS/MISS against DESIGN.md section 6 and writes a JSON
report to ``loadtest/reports/`` (``--report-dir``). Every figure is what this
run measured on this machine; nothing is extrapolated.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from hdrh.histogram import HdrHistogram

from dstl_client import ChangelogClient
from dstl_server.settings import ServerSettings
from dstl_server.testing import ServerProcess
from loadtest.baseline import new_latency_histogram, store_put_latency, store_throughput
from loadtest.probe import MetricsSnapshot, RssSampler, sampling_rss, scrape
from loadtest.writer_proc import WAIT_TIMEOUT_S, WriterPlan, WriterResult, process_main

DEFAULT_REPORT_DIR = Path(__file__).resolve().parent / "reports"
MiB = 1 << 20

# DESIGN.md section 6
TARGET_MB_PER_S = 200.0
TARGET_CHANGES_PER_S = 1_000_000.0
TARGET_ADDED_P50_MS = 5.0
TARGET_ADDED_P99_MS = 20.0
TARGET_WRITERS = 64
#: RSS counts as flat when the second half of a run peaks at most this much above the first
FLAT_RSS_FACTOR = 1.10
FLAT_RSS_SLACK = 16 * MiB


class BenchError(RuntimeError):
    """A writer or the server failed; the run has no valid figures."""


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything a run depends on (recorded in the report)."""

    processes: int = 2
    threads: int = 4
    duration_s: float = 45.0
    small_change_bytes: int = 128
    large_change_bytes: int = 16 * 1024
    batch_bytes: int = 1 * MiB
    checkpoint_interval_s: float = 1.0
    writer_counts: tuple[int, ...] = (1, 8, 64)
    rounds: int = 200
    warmup_rounds: int = 3
    round_bytes: int = 16 * 1024
    round_interval_s: float = 0.1
    appends_with_persist: bool = False
    max_processes: int = min(4, os.cpu_count() or 1)
    persist_delay_ms: float = 10.0
    fsync: bool = True
    min_baseline_puts: int = 300
    rpc_calls: int = 2000
    quick: bool = False


QUICK = {
    "processes": 2,
    "threads": 2,
    "duration_s": 2.0,
    "writer_counts": (1, 8),
    "rounds": 12,
    "warmup_rounds": 2,
    "min_baseline_puts": 20,
    "rpc_calls": 200,
}


# ---------------------------------------------------------------- helpers
def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


def _percentiles(hist: HdrHistogram) -> dict[str, float]:
    """p50/p99/p999/max/mean in milliseconds."""
    if hist.get_total_count() == 0:
        return {"p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0, "mean": 0.0, "count": 0}
    return {
        "p50": _ms(hist.get_value_at_percentile(50)),
        "p99": _ms(hist.get_value_at_percentile(99)),
        "p999": _ms(hist.get_value_at_percentile(99.9)),
        "max": _ms(hist.get_max_value()),
        "mean": _ms(hist.get_mean_value()),
        "count": int(hist.get_total_count()),
    }


def _histogram(results: Sequence[WriterResult]) -> HdrHistogram:
    hist = new_latency_histogram()
    for r in results:
        for us in r.persist_latencies_us:
            hist.record_value(max(1, us))
    return hist


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _say(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------- the run
class Bench:
    """One benchmark run against one server process."""

    def __init__(self, cfg: BenchConfig, root: Path) -> None:
        self.cfg = cfg
        self.root = root
        self.server: ServerProcess | None = None
        self.rss: RssSampler | None = None
        self.upload_slots = ServerSettings().max_concurrent_uploads

    # ------------------------------------------------------------ plumbing
    def _scrape(self) -> MetricsSnapshot:
        assert self.server is not None
        return scrape(self.server.metrics_port)

    def _cpu_s(self) -> float:
        """CPU seconds the server process has used so far (user + system)."""
        assert self.server is not None and self.server.proc is not None
        t = psutil.Process(self.server.proc.pid).cpu_times()
        return float(t.user + t.system)

    def _objects_dir(self, job_id: str) -> Path:
        return self.root / "server" / "objects" / job_id

    def _run_writers(self, plans: list[WriterPlan], timeout_s: float) -> list[WriterResult]:
        """Run one writer process per plan; every writer's result, or BenchError."""
        ctx = mp.get_context("spawn")  # no fork after grpc or threads exist
        writers = sum(p.threads for p in plans)
        ready = ctx.Barrier(writers + 1)
        origin = ctx.Value("d", 0.0)
        round_barrier = ctx.Barrier(writers) if plans[0].mode == "rounds" else None
        results: Any = ctx.Queue()
        procs = [
            ctx.Process(
                target=process_main,
                args=(plan, ready, origin, round_barrier, results),
                name=f"bench-writers-{i}",
                daemon=True,
            )
            for i, plan in enumerate(plans)
        ]
        for p in procs:
            p.start()
        out: list[WriterResult] = []
        deadline = time.monotonic() + timeout_s
        try:
            try:
                ready.wait(WAIT_TIMEOUT_S)
                # far enough ahead that every writer has seen it before it comes
                origin.value = time.monotonic() + 0.2
            except threading.BrokenBarrierError:
                pass  # a writer failed during setup: its result says why
            while len(out) < writers:
                if time.monotonic() > deadline:
                    raise BenchError(f"writers did not finish within {timeout_s:.0f}s")
                try:
                    out.append(results.get(timeout=1.0))
                except queue.Empty:
                    if not any(p.is_alive() for p in procs):
                        try:  # a result may have arrived just before the exit
                            while True:
                                out.append(results.get(timeout=0.5))
                        except queue.Empty:
                            pass
                        if len(out) < writers:
                            codes = [p.exitcode for p in procs]
                            raise BenchError(
                                f"writer processes exited (codes {codes}) with "
                                f"{writers - len(out)} writer(s) unreported"
                            ) from None
        finally:
            for p in procs:
                p.join(30)
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(10)
            results.close()
        errors = [r.error for r in out if r.error]
        # the root cause first: the others mostly failed at a barrier it broke
        errors.sort(key=lambda e: "BrokenBarrierError" in e)
        if errors:
            raise BenchError(f"{len(errors)} writer(s) failed; first: {errors[0]}")
        return sorted(out, key=lambda r: r.writer)

    def _plans(self, base: WriterPlan, writers: int, processes: int) -> list[WriterPlan]:
        plans = []
        first = 0
        for n in _split(writers, min(processes, writers)):
            plans.append(replace(base, first_writer=first, threads=n))
            first += n
        return plans

    # ------------------------------------------------------------ phases
    def append_phase(self, name: str, change_bytes: int) -> dict[str, Any]:
        cfg = self.cfg
        assert self.server is not None and self.rss is not None
        job = f"bench-append-{change_bytes}"
        writers = cfg.processes * cfg.threads
        _say(
            f"[append/{name}] {writers} writers in {cfg.processes} processes, "
            f"{change_bytes} B changes, {cfg.duration_s:g}s ..."
        )
        base = WriterPlan(
            target=self.server.address,
            job_id=job,
            mode="stream",
            first_writer=0,
            threads=0,
            change_bytes=change_bytes,
            batch_bytes=cfg.batch_bytes,
            duration_s=cfg.duration_s,
            checkpoint_interval_s=cfg.checkpoint_interval_s,
        )
        before = self._scrape()
        results = self._run_writers(
            self._plans(base, writers, cfg.processes), cfg.duration_s + 2 * WAIT_TIMEOUT_S
        )
        delta = self._scrape().minus(before)
        started = min(r.started for r in results)
        finished = max(r.finished for r in results)
        seconds = finished - started
        cpu_cores = self.rss.cpu_cores(started, finished)
        client_cores = sum(r.process_cpu_s for r in results) / seconds
        changes = sum(r.changes for r in results)
        payload = sum(r.payload_bytes for r in results)
        uploads = delta.total("dstl_uploads_total", result="ok")
        upload_bytes = delta.total("dstl_upload_bytes_total")
        mean_object = upload_bytes / uploads if uploads else 0.0
        rss = self.rss.window(started, finished)
        half = len(rss) // 2
        first_peak = max(rss[:half], default=0)
        second_peak = max(rss[half:], default=0)
        flat = second_peak <= first_peak * FLAT_RSS_FACTOR + FLAT_RSS_SLACK
        shutil.rmtree(self._objects_dir(job), ignore_errors=True)

        _say(f"[append/{name}] baseline: {upload_bytes / 1e6:,.0f} MB straight to the store ...")
        baseline = store_throughput(
            self.root / "baseline",
            fsync=cfg.fsync,
            total_bytes=int(upload_bytes),
            object_bytes=int(mean_object),
            concurrency=self.upload_slots,
        )
        mb_per_s = payload / seconds / 1e6
        stored_mb_per_s = upload_bytes / seconds / 1e6
        out = {
            "name": name,
            "writers": writers,
            "processes": cfg.processes,
            "change_bytes": change_bytes,
            "seconds": round(seconds, 3),
            "changes": changes,
            "payload_bytes": payload,
            "changes_per_s": round(changes / seconds, 1),
            "mb_per_s": round(mb_per_s, 2),
            "server_appended_bytes": int(delta.total("dstl_appended_bytes_total")),
            "server_appended_changes": int(delta.total("dstl_appended_changes_total")),
            "append_requests": int(delta.total("dstl_append_requests_total")),
            "uploads": int(uploads),
            "upload_failures": int(delta.total("dstl_uploads_total", result="failed")),
            "preemptive_uploads": int(delta.total("dstl_preemptive_uploads_total")),
            "flushes": int(delta.total("dstl_flushes_total")),
            "upload_bytes": int(upload_bytes),
            "mean_object_bytes": int(mean_object),
            "backpressure_waits": int(delta.total("dstl_backpressure_waits_total")),
            # CPU the server used while the writers appended (sampled with RSS)
            "server_cpu_cores": round(cpu_cores, 3),
            "server_cpu_us_per_change": round(cpu_cores * seconds / changes * 1e6, 3)
            if changes
            else 0.0,
            # CPU the writer processes used (client library, gRPC, the load loop)
            "writers_cpu_cores": round(client_cores, 3),
            "persist_under_load_ms": _percentiles(_histogram(results)),
            "rss": {
                "peak_bytes": max(rss, default=0),
                "first_half_peak_bytes": first_peak,
                "second_half_peak_bytes": second_peak,
                "samples": len(rss),
                "flat": flat,
            },
            "baseline": {
                "objects": baseline.objects,
                "object_bytes": baseline.object_bytes,
                "seconds": round(baseline.seconds, 3),
                "mb_per_s": round(baseline.mb_per_s, 2),
                "concurrency": self.upload_slots,
            },
            # stored bytes per second, service over store: 1.0 = no overhead
            "ratio_to_store": round(stored_mb_per_s / baseline.mb_per_s, 3)
            if baseline.mb_per_s
            else 0.0,
        }
        _say(
            f"[append/{name}] {out['changes_per_s']:,.0f} changes/s, {mb_per_s:,.1f} MB/s; "
            f"store alone {baseline.mb_per_s:,.1f} MB/s; peak RSS {max(rss, default=0) / MiB:,.0f} MiB"
        )
        return out

    def checkpoint_phase(self, writers: int) -> dict[str, Any]:
        cfg = self.cfg
        assert self.server is not None and self.rss is not None
        job = f"bench-ckpt-{writers}"
        processes = min(cfg.max_processes, writers)
        _say(
            f"[checkpoint/{writers}] {writers} writers in {processes} processes, "
            f"{cfg.rounds} rounds of {cfg.round_bytes} B per writer ..."
        )
        base = WriterPlan(
            target=self.server.address,
            job_id=job,
            mode="rounds",
            first_writer=0,
            threads=0,
            change_bytes=cfg.small_change_bytes,
            batch_bytes=cfg.batch_bytes,
            rounds=cfg.rounds,
            round_bytes=cfg.round_bytes,
            round_interval_s=cfg.round_interval_s,
            warmup_rounds=cfg.warmup_rounds,
            appends_with_persist=cfg.appends_with_persist,
        )
        before, cpu0 = self._scrape(), self._cpu_s()
        results = self._run_writers(
            self._plans(base, writers, processes), cfg.rounds * 5.0 + 2 * WAIT_TIMEOUT_S
        )
        delta, cpu_s = self._scrape().minus(before), self._cpu_s() - cpu0
        shutil.rmtree(self._objects_dir(job), ignore_errors=True)
        flushes = delta.total("dstl_flushes_total")
        objects = delta.total("dstl_uploads_total", result="ok")
        failed = delta.total("dstl_uploads_total", result="failed")
        upload_bytes = delta.total("dstl_upload_bytes_total")
        lpo_count = delta.total("dstl_upload_logs_per_object_count")
        lpo_mean = delta.total("dstl_upload_logs_per_object_sum") / lpo_count if lpo_count else 0
        per_round = [
            len({r.round_objects[i] for r in results}) for i in range(cfg.rounds)
        ]  # distinct objects holding one round's changes, from the handles
        spread = sorted(
            max(r.round_calls[i] for r in results) - min(r.round_calls[i] for r in results)
            for i in range(cfg.warmup_rounds, cfg.rounds)
        )  # how far apart the writers' persist calls of one round were (client side)
        persist_hist = _histogram(results)
        persist = _percentiles(persist_hist)
        mean_object = int(upload_bytes / objects) if objects else 0
        puts = max(cfg.rounds, cfg.min_baseline_puts)
        _say(f"[checkpoint/{writers}] baseline: {puts} puts of {mean_object:,} B ...")
        put_hist = store_put_latency(
            self.root / "baseline", fsync=cfg.fsync, object_bytes=mean_object, count=puts
        )
        put = _percentiles(put_hist)
        added = {
            q: round(max(0.0, persist[q] - cfg.persist_delay_ms - put[q]), 3)
            for q in ("p50", "p99", "p999")
        }
        srv_count = delta.total("dstl_persist_latency_seconds_count")
        srv_mean_ms = (
            delta.total("dstl_persist_latency_seconds_sum") / srv_count * 1000 if srv_count else 0
        )
        out = {
            "writers": writers,
            "processes": processes,
            "rounds": cfg.rounds,
            "warmup_rounds": cfg.warmup_rounds,
            "round_bytes_per_writer": cfg.round_bytes,
            "persist_ms": persist,
            "server_persist_mean_ms": round(srv_mean_ms, 3),
            # server CPU per round: every writer's append and persist RPC, uploads included
            "server_cpu_ms_per_round": round(cpu_s / cfg.rounds * 1000, 3),
            "store_put_ms": put,
            "added_ms": added,
            "flushes": int(flushes),
            "flushes_by_trigger": {
                k: int(v) for k, v in delta.by_label("dstl_flushes_total", "trigger").items() if v
            },
            "objects": int(objects),
            "upload_failures": int(failed),
            "objects_per_flush": round(objects / flushes, 3) if flushes else 0.0,
            "logs_per_object_mean": round(lpo_mean, 2),
            "mean_object_bytes": mean_object,
            "flushes_per_round": round(flushes / cfg.rounds, 3),
            "call_spread_ms": {
                "p50": round(spread[len(spread) // 2] * 1000, 3) if spread else 0.0,
                "max": round(spread[-1] * 1000, 3) if spread else 0.0,
            },
            "objects_per_round": {
                "mean": round(sum(per_round) / len(per_round), 3),
                "max": max(per_round),
            },
        }
        _say(
            f"[checkpoint/{writers}] persist p50 {persist['p50']:.2f} ms p99 {persist['p99']:.2f} ms"
            f" p99.9 {persist['p999']:.2f} ms; store put p50 {put['p50']:.2f} ms;"
            f" {out['objects_per_flush']} object(s)/flush, {out['flushes_per_round']} flush(es)/round"
        )
        return out

    def rpc_phase(self, calls: int) -> dict[str, Any]:
        """Cost of one trivial unary call (LastAppendedSqn), sequential, one client.

        The floor under every append and persist: with N writers persisting
        together the server spends at least N times this on the calls alone.
        """
        assert self.server is not None
        with ChangelogClient(self.server.address) as client:
            client.wait_ready(30)
            with client.create_writer(
                job_id="bench-rpc", operator_id="rpc", key_group_range=(0, 0)
            ) as w:
                for _ in range(max(10, calls // 10)):  # warm-up
                    w.last_appended_sqn()
                cpu0, t0 = self._cpu_s(), time.perf_counter()
                for _ in range(calls):
                    w.last_appended_sqn()
                wall, cpu_s = time.perf_counter() - t0, self._cpu_s() - cpu0
        out = {
            "calls": calls,
            "wall_us_per_call": round(wall / calls * 1e6, 1),
            "server_cpu_us_per_call": round(cpu_s / calls * 1e6, 1),
        }
        _say(
            f"[rpc] one unary call: {out['wall_us_per_call']:.0f} us round trip, "
            f"{out['server_cpu_us_per_call']:.0f} us of server CPU"
        )
        return out

    # ------------------------------------------------------------ driver
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
            self.server = server
            assert server.proc is not None
            _say(f"server pid {server.proc.pid} at {server.address}, objects under {self.root}")
            with sampling_rss(server.proc.pid) as rss:
                self.rss = rss
                idle_rss = int(psutil.Process(server.proc.pid).memory_info().rss)
                rpc = self.rpc_phase(cfg.rpc_calls)
                append = [
                    self.append_phase("small", cfg.small_change_bytes),
                    self.append_phase("large", cfg.large_change_bytes),
                ]
                checkpoint = [self.checkpoint_phase(w) for w in cfg.writer_counts]
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
            "config": {**_config_dict(cfg)},
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
        report["targets"] = _targets(report)
        return report


def _config_dict(cfg: BenchConfig) -> dict[str, Any]:
    return asdict(cfg)


# ---------------------------------------------------------------- targets
def _targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    append = report["append"]
    ckpt = report["checkpoint"]
    best = max(append, key=lambda a: a["mb_per_s"])
    small = min(append, key=lambda a: a["change_bytes"])
    counts = ", ".join(str(c["writers"]) for c in ckpt)
    per_flush = " / ".join(f"{c['objects_per_flush']:g}" for c in ckpt)
    biggest = max(ckpt, key=lambda c: c["writers"])
    w = biggest["writers"]
    note = "" if w >= TARGET_WRITERS else f" (only {w} writers in this run)"
    return [
        {
            "target": "objects per flush",
            "goal": f"1 whatever the writer count ({counts})",
            "measured": per_flush,
            "pass": all(
                c["objects"] == c["flushes"] and c["flushes"] > 0 and not c["upload_failures"]
                for c in ckpt
            ),
        },
        {
            "target": "append throughput",
            "goal": f">= {TARGET_MB_PER_S:g} MB/s",
            "measured": f"{best['mb_per_s']:,.1f} MB/s ({best['change_bytes']} B changes)",
            "pass": best["mb_per_s"] >= TARGET_MB_PER_S,
        },
        {
            "target": "append rate",
            "goal": f">= {TARGET_CHANGES_PER_S:,.0f} changes/s",
            "measured": f"{small['changes_per_s']:,.0f} changes/s ({small['change_bytes']} B changes)",
            "pass": small["changes_per_s"] >= TARGET_CHANGES_PER_S,
        },
        {
            "target": "flat memory under appends",
            "goal": f"2nd-half RSS peak <= 1st-half x {FLAT_RSS_FACTOR:g} + {FLAT_RSS_SLACK // MiB} MiB",
            "measured": "; ".join(
                f"{a['rss']['first_half_peak_bytes'] / MiB:,.0f} -> "
                f"{a['rss']['second_half_peak_bytes'] / MiB:,.0f} MiB"
                for a in append
            ),
            "pass": report["memory"]["flat"],
        },
        {
            "target": f"added persist latency p50, {w} writers{note}",
            "goal": f"< {TARGET_ADDED_P50_MS:g} ms",
            "measured": f"{biggest['added_ms']['p50']:.2f} ms",
            "pass": biggest["added_ms"]["p50"] < TARGET_ADDED_P50_MS,
        },
        {
            "target": f"added persist latency p99, {w} writers{note}",
            "goal": f"< {TARGET_ADDED_P99_MS:g} ms",
            "measured": f"{biggest['added_ms']['p99']:.2f} ms",
            "pass": biggest["added_ms"]["p99"] < TARGET_ADDED_P99_MS,
        },
    ]


# ---------------------------------------------------------------- output
def format_report(report: dict[str, Any]) -> str:
    """The human-readable table printed at the end of a run."""
    cfg = report["config"]
    lines = [
        "",
        f"dstl benchmark -- {report['machine']['cpus']} CPUs, Python {report['machine']['python']}, "
        f"file:// store, fsync {'on' if cfg['fsync'] else 'off'}, "
        f"persist delay {cfg['persist_delay_ms']:g} ms, {report['seconds']:g}s",
        "",
        "Append (batched, pre-emptive uploads on; MB = 10^6 bytes of change payload)",
        f"  {'run':<8}{'writers':>8}{'change':>9}{'changes/s':>13}{'MB/s':>9}"
        f"{'store MB/s':>12}{'ratio':>7}{'objects':>9}{'peak RSS':>10}{'srv CPU':>9}"
        f"{'wrt CPU':>9}",
    ]
    for a in report["append"]:
        lines.append(
            f"  {a['name']:<8}{a['writers']:>8}{a['change_bytes']:>8}B{a['changes_per_s']:>13,.0f}"
            f"{a['mb_per_s']:>9,.1f}{a['baseline']['mb_per_s']:>12,.1f}{a['ratio_to_store']:>7.2f}"
            f"{a['uploads']:>9}{a['rss']['peak_bytes'] / MiB:>7,.0f}MiB"
            f"{a['server_cpu_cores']:>9.2f}{a['writers_cpu_cores']:>9.2f}"
        )
    lines += [
        "  (ratio = bytes stored per second through the service / the same bytes put straight "
        "into the store;",
        "   srv CPU / wrt CPU = cores the server / the writer processes used, on the same "
        f"{report['machine']['cpus']} cores)",
        "",
        "Checkpoints (all writers persist together; latency in ms, client side)",
        f"  {'writers':>7}{'p50':>8}{'p99':>8}{'p99.9':>8}{'put p50':>9}{'put p99':>9}"
        f"{'added p50':>11}{'p99':>7}{'p99.9':>7}{'obj/flush':>10}{'flush/rnd':>10}{'logs/obj':>9}",
    ]
    for c in report["checkpoint"]:
        p, s, d = c["persist_ms"], c["store_put_ms"], c["added_ms"]
        lines.append(
            f"  {c['writers']:>7}{p['p50']:>8.2f}{p['p99']:>8.2f}{p['p999']:>8.2f}"
            f"{s['p50']:>9.2f}{s['p99']:>9.2f}{d['p50']:>11.2f}{d['p99']:>7.2f}{d['p999']:>7.2f}"
            f"{c['objects_per_flush']:>10g}{c['flushes_per_round']:>10g}{c['logs_per_object_mean']:>9g}"
        )
    lines += [
        f"  (added = persist - {cfg['persist_delay_ms']:g} ms persist delay - store put, "
        "quantile by quantile, floored at 0)",
        "",
        "Checkpoint diagnostics",
        f"  {'writers':>7}{'flushes by trigger':>34}{'call spread p50/max ms':>24}"
        f"{'srv persist mean ms':>21}{'srv CPU ms/round':>18}",
    ]
    for c in report["checkpoint"]:
        triggers = " ".join(f"{k}={v}" for k, v in sorted(c["flushes_by_trigger"].items()))
        spread = f"{c['call_spread_ms']['p50']:.1f} / {c['call_spread_ms']['max']:.1f}"
        lines.append(
            f"  {c['writers']:>7}{triggers:>34}{spread:>24}"
            f"{c['server_persist_mean_ms']:>21.2f}{c['server_cpu_ms_per_round']:>18.2f}"
        )
    rpc = report["rpc"]
    lines += [
        "  (call spread = how far apart one round's persist calls left the writers)",
        f"  one unary call (LastAppendedSqn, sequential): {rpc['wall_us_per_call']:.0f} us round "
        f"trip, {rpc['server_cpu_us_per_call']:.0f} us of server CPU",
        "",
        f"Memory: idle RSS {report['memory']['idle_rss_bytes'] / MiB:,.0f} MiB, peak "
        f"{report['memory']['peak_rss_bytes'] / MiB:,.0f} MiB "
        f"(in-flight bound {report['memory']['max_in_flight_bytes'] / MiB:,.0f} MiB)",
        "",
        "Targets (DESIGN.md section 6)",
    ]
    for t in report["targets"]:
        verdict = "PASS" if t["pass"] else "MISS"
        lines.append(f"  {verdict}  {t['target']}: {t['measured']}  (goal {t['goal']})")
    return "\n".join(lines)


def write_report(report: dict[str, Any], report_dir: Path) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = report_dir / f"bench-{stamp}{'-quick' if report['config']['quick'] else ''}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)
    return path


# ---------------------------------------------------------------- CLI
def _counts(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,8,64, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("writer counts must be >= 1")
    return out


def _positive(typ: type) -> Any:
    def parse(text: str) -> Any:
        value = typ(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench",
        description="Benchmark one dstl-server process against DESIGN.md section 6.",
    )
    p.add_argument("--quick", action="store_true", help="a few seconds per phase (smoke test)")
    p.add_argument(
        "--duration",
        type=_positive(float),
        help=f"seconds per append run (default {d.duration_s:g})",
    )
    p.add_argument(
        "--processes",
        type=_positive(int),
        help=f"writer processes in the append runs (default {d.processes})",
    )
    p.add_argument(
        "--threads",
        type=_positive(int),
        help=f"writers per process in the append runs (default {d.threads})",
    )
    p.add_argument(
        "--change-bytes",
        type=_positive(int),
        help=f"change size of the small-change run (default {d.small_change_bytes})",
    )
    p.add_argument(
        "--large-change-bytes",
        type=_positive(int),
        help=f"change size of the large-change run (default {d.large_change_bytes})",
    )
    p.add_argument(
        "--batch-bytes", type=_positive(int), help=f"client append batch (default {d.batch_bytes})"
    )
    p.add_argument(
        "--checkpoint-interval",
        type=_positive(float),
        help=f"seconds between checkpoints in the append runs (default {d.checkpoint_interval_s:g})",
    )
    p.add_argument(
        "--writers", type=_counts, help="writer counts of the checkpoint runs (default 1,8,64)"
    )
    p.add_argument(
        "--rounds", type=_positive(int), help=f"checkpoints per checkpoint run (default {d.rounds})"
    )
    p.add_argument(
        "--round-bytes",
        type=_positive(int),
        help=f"bytes each writer appends per checkpoint (default {d.round_bytes})",
    )
    p.add_argument(
        "--round-interval-ms",
        type=_positive(float),
        help=f"time between checkpoint rounds (default {d.round_interval_s * 1000:g})",
    )
    p.add_argument(
        "--appends-with-persist",
        action="store_true",
        default=None,
        help="checkpoint runs: each round's appends travel inside the persist call "
        "(the real checkpoint path) instead of being sent before the timer starts",
    )
    p.add_argument(
        "--max-processes",
        type=_positive(int),
        help=f"writer processes in the checkpoint runs (default {d.max_processes})",
    )
    p.add_argument(
        "--persist-delay-ms",
        type=float,
        help=f"server persist delay (default {d.persist_delay_ms:g})",
    )
    p.add_argument(
        "--fsync",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fsync objects, service and baseline alike (default on)",
    )
    p.add_argument(
        "--dir",
        type=Path,
        help="work directory for objects (default: a new temp dir, removed after)",
    )
    p.add_argument(
        "--report-dir",
        type=Path,
        default=DEFAULT_REPORT_DIR,
        help="where the JSON report goes (default loadtest/reports)",
    )
    return p


def config_from_args(ns: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig(quick=ns.quick)
    if ns.quick:
        cfg = replace(cfg, **QUICK)  # type: ignore[arg-type]
    flags = {
        "duration_s": ns.duration,
        "processes": ns.processes,
        "threads": ns.threads,
        "small_change_bytes": ns.change_bytes,
        "large_change_bytes": ns.large_change_bytes,
        "batch_bytes": ns.batch_bytes,
        "checkpoint_interval_s": ns.checkpoint_interval,
        "writer_counts": ns.writers,
        "rounds": ns.rounds,
        "round_bytes": ns.round_bytes,
        "round_interval_s": ns.round_interval_ms / 1000 if ns.round_interval_ms else None,
        "max_processes": ns.max_processes,
        "persist_delay_ms": ns.persist_delay_ms,
        "fsync": ns.fsync,
        "appends_with_persist": ns.appends_with_persist,
    }
    cfg = replace(cfg, **{k: v for k, v in flags.items() if v is not None})
    if cfg.warmup_rounds >= cfg.rounds:
        cfg = replace(cfg, warmup_rounds=0)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    cfg = config_from_args(ns)
    work = ns.dir
    made = work is None
    root = Path(tempfile.mkdtemp(prefix="dstl-bench-")) if made else work.resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        report = Bench(cfg, root).run()
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if made:
            shutil.rmtree(root, ignore_errors=True)
    print(format_report(report))
    path = write_report(report, ns.report_dir)
    print(f"\nreport: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
