"""One configuration measured, and the whole run: SeaweedFS, each configuration, the goals."""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from dstl_client import ChangelogClient
from dstl_server.testing_s3 import SeaweedS3
from loadtest.s3fault import FaultProxyProcess
from loadtest.tree_bench.cluster import ProcUsage, UsageSampler, sidecars
from loadtest.tree_bench.config import (
    FANOUT,
    LATENCY_MAX_US,
    SECONDS_PER_MONTH,
    BenchConfig,
    TreeShape,
)
from loadtest.tree_bench.writers import WriterProcesses, WriterRun


@dataclass(slots=True)
class ConfigResult:
    """The figures of one configuration (the measured rounds only, unless noted)."""

    name: str
    fanout: int
    depth: int
    delays_ms: str
    rounds: int
    persists: int
    objects_per_ckpt: float
    objects_per_ckpt_max: int
    puts_per_ckpt: float
    bucket_objects: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mb_s: float
    upload_mb_s: float
    forward_fallbacks: int
    puts_month_100: float
    verified: int
    mismatches: list[str]
    usage: list[ProcUsage]
    proxy_puts: int | None = None
    latencies_ms: list[float] = field(default_factory=list)
    objects_by_round: list[int] = field(default_factory=list)
    #: flushes over every sidecar by trigger (warm-up included): what released the objects
    flush_triggers: dict[str, int] = field(default_factory=dict)


def _count_bucket(s3: SeaweedS3, prefix: str) -> int:
    client = s3.boto3_client()
    try:
        n = 0
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=s3.bucket, Prefix=prefix + "/", PaginationConfig={"MaxItems": 1_000_000}
        )
        for page in pages:
            n += len(page.get("Contents", ()))
        return n
    finally:
        client.close()


def _verify(
    runs: list[WriterRun], clients: list[ChangelogClient], cfg: BenchConfig
) -> tuple[int, list[str]]:
    """Read back sampled handles through their node's sidecar; byte-exact or a mismatch line."""
    checked, bad = 0, []
    for run in runs:
        for p in run.persisted:
            if p.want is None or checked >= cfg.verify_max:
                continue
            checked += 1
            try:
                got = sorted(
                    (kg, data) for kg, _sqn, data in clients[run.node].read_changes(p.handle)
                )
            except Exception as exc:
                bad.append(f"node {run.node} writer {run.index} round {p.round}: {exc!r}")
                continue
            if got != sorted(p.want):
                bad.append(
                    f"node {run.node} writer {run.index} round {p.round}: "
                    f"{len(got)} changes read, {len(p.want)} written, not byte-exact"
                )
    return checked, bad


def run_config(
    cfg: BenchConfig, name: str, s3: SeaweedS3, proxy: FaultProxyProcess | None, work: Path
) -> ConfigResult:
    """Fresh sidecars on a fresh prefix, the writers, then the figures."""
    shape = TreeShape(cfg.nodes, FANOUT[name])
    prefix = f"{name}-{int(time.time() * 1000)}"
    endpoint = proxy.url if proxy is not None else s3.endpoint_url
    s3_args = ["--s3-endpoint-url", endpoint, "--s3-region", s3.region]
    if proxy is not None:
        proxy.set_faults(cfg.faults())
    with sidecars(cfg, shape, work / name, s3.storage_url(prefix), s3_args, s3.env()) as procs:
        pids = {f"sidecar-{i}": p.proc.pid for i, p in enumerate(procs) if p.proc is not None}
        if s3.proc is not None:
            pids["weed"] = s3.proc.pid
        if proxy is not None and proxy.proc is not None:
            pids["fault-proxy"] = proxy.proc.pid
        pids["driver"] = os.getpid()
        if proxy is not None:
            proxy.reset_stats()
        hold = [cfg.idle_writer and bool(shape.children(i)) for i in range(shape.nodes)]
        with WriterProcesses([p.address for p in procs], cfg, hold) as writers:
            pids.update(writers.pids)
            start = time.monotonic() + 0.5
            with UsageSampler(pids) as sampler:
                runs = writers.run(start)
                wall = time.monotonic() - start
                usage = sampler.result()
        clients = [ChangelogClient(p.address) for p in procs]
        try:
            errors = [r.error for r in runs if r.error]
            if errors:
                raise RuntimeError(f"{len(errors)} writer(s) failed; first: {errors[0]}")
            time.sleep(0.3)
            metrics = [p.scrape_metrics() for p in procs]
            checked, bad = _verify(runs, clients, cfg)
        finally:
            for c in clients:
                c.close()
        proxy_puts = None
        if proxy is not None:
            proxy_puts = int(proxy.stats()["by_op"].get("PutObject", 0))
    bucket_objects = _count_bucket(s3, prefix)

    hist = HdrHistogram(1, LATENCY_MAX_US, 3)
    lat_ms: list[float] = []
    keys_by_round: dict[int, set[str]] = defaultdict(set)
    nbytes = 0
    for run in runs:
        for p in run.persisted:
            if p.round < cfg.warmup_rounds:
                continue
            hist.record_value(min(p.latency_us, LATENCY_MAX_US))
            lat_ms.append(p.latency_us / 1000)
            keys_by_round[p.round].update(p.handle.object_keys)
            nbytes += p.nbytes
    total_rounds = max(1, max((p.round for r in runs for p in r.persisted), default=0) + 1)
    measured = sorted(keys_by_round)
    per_round = [len(keys_by_round[r]) for r in measured]
    uploads = sum(
        m.get('dstl_uploads_total{result="ok"}', 0)
        + m.get('dstl_uploads_total{result="failed"}', 0)
        for m in metrics
    )
    upload_bytes = sum(m.get("dstl_upload_bytes_total", 0) for m in metrics)
    fallbacks = sum(
        v for m in metrics for k, v in m.items() if k.startswith("dstl_forward_fallbacks")
    )
    triggers: dict[str, int] = defaultdict(int)
    for m in metrics:
        for k, v in m.items():
            if k.startswith('dstl_flushes_total{trigger="'):
                triggers[k.split('"')[1]] += int(v)
    puts_per_ckpt = (proxy_puts if proxy_puts is not None else uploads) / total_rounds
    measured_wall = max(1e-6, wall - cfg.warmup_rounds * cfg.interval_s)
    return ConfigResult(
        name=name,
        fanout=shape.fanout,
        depth=max(shape.depth(i) for i in range(shape.nodes)),
        delays_ms="/".join(
            f"{d:g}"
            for d in sorted({shape.delay_ms(i, cfg) for i in range(shape.nodes)}, reverse=True)
        ),
        rounds=len(measured),
        persists=int(hist.get_total_count()),
        objects_per_ckpt=statistics.fmean(per_round) if per_round else 0.0,
        objects_per_ckpt_max=max(per_round, default=0),
        puts_per_ckpt=puts_per_ckpt,
        bucket_objects=bucket_objects,
        p50_ms=hist.get_value_at_percentile(50) / 1000,
        p99_ms=hist.get_value_at_percentile(99) / 1000,
        p999_ms=hist.get_value_at_percentile(99.9) / 1000,
        max_ms=hist.get_max_value() / 1000,
        mb_s=nbytes / measured_wall / 1e6,
        upload_mb_s=upload_bytes / max(1e-6, wall) / 1e6,
        forward_fallbacks=int(fallbacks),
        puts_month_100=puts_per_ckpt / cfg.nodes * 100 * SECONDS_PER_MONTH / cfg.interval_s,
        verified=checked,
        mismatches=bad,
        usage=usage,
        proxy_puts=proxy_puts,
        latencies_ms=lat_ms,
        objects_by_round=per_round,
        flush_triggers=dict(triggers),
    )


def goals(results: dict[str, ConfigResult]) -> list[tuple[bool, str]]:
    """The goals against the figures of this run: (passed, line)."""
    out: list[tuple[bool, str]] = []
    direct, tree4 = results.get("direct"), results.get("tree4")
    if direct is not None and tree4 is not None:
        limit = direct.objects_per_ckpt / 4
        out.append(
            (
                tree4.objects_per_ckpt <= limit,
                f"objects per checkpoint, fan-out 4: {tree4.objects_per_ckpt:.2f} "
                f"<= direct/4 = {limit:.2f}",
            )
        )
        limit = 1.5 * direct.p99_ms
        out.append(
            (
                tree4.p99_ms <= limit,
                f"persist p99, fan-out 4: {tree4.p99_ms:.1f} ms <= 1.5 x direct p99 = {limit:.1f} ms",
            )
        )
    faults = results.get("tree4-faults")
    if faults is not None:
        out.append(
            (
                faults.verified > 0 and not faults.mismatches,
                f"no acknowledged loss behind the fault proxy, fan-out 4: "
                f"{faults.verified - len(faults.mismatches)}/{faults.verified} sampled handles "
                f"byte-exact, all {faults.persists} measured persists acknowledged",
            )
        )
    checked = sum(r.verified for r in results.values())
    bad = [m for r in results.values() for m in r.mismatches]
    out.append(
        (
            checked > 0 and not bad,
            f"acknowledged handles read back byte-exact: {checked - len(bad)}/{checked} sampled"
            + (f" (first: {bad[0]})" if bad else ""),
        )
    )
    return out


def run(cfg: BenchConfig, report_dir: Path, work_dir: Path | None = None) -> dict[str, Any]:
    """Every configuration in turn; returns the results, the goals and the report path."""
    from loadtest.tree_bench.report import write_report

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results: dict[str, ConfigResult] = {}
    with contextlib.ExitStack() as stack:
        work = work_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="tree-bench-"))
        )
        print(f"[tree-bench] starting SeaweedFS; K={cfg.nodes} W={cfg.writers} "
              f"{cfg.duration_s:g} s per configuration", flush=True)  # fmt: skip
        s3 = stack.enter_context(SeaweedS3())
        proxy: FaultProxyProcess | None = None
        for name in cfg.configs:
            if name.endswith("-faults"):
                if not cfg.fault_proxy:
                    continue
                if proxy is None:
                    proxy = stack.enter_context(FaultProxyProcess(s3.endpoint_url, seed=cfg.seed))
            t0 = time.monotonic()
            print(f"[tree-bench] {name}: running", flush=True)
            r = run_config(cfg, name, s3, proxy if name.endswith("-faults") else None, work)
            results[name] = r
            print(
                f"[tree-bench] {name}: done in {time.monotonic() - t0:.1f} s; "
                f"{r.objects_per_ckpt:.2f} objects/ckpt, {r.puts_per_ckpt:.2f} PUTs/ckpt, "
                f"p50 {r.p50_ms:.1f} p99 {r.p99_ms:.1f} p99.9 {r.p999_ms:.1f} ms, "
                f"{r.mb_s:.2f} MB/s, verified {r.verified} ({len(r.mismatches)} bad)",
                flush=True,
            )
    checks = goals(results)
    path = write_report(cfg, results, checks, report_dir, stamp)
    return {"results": results, "goals": checks, "path": path}
