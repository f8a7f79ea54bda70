"""The append phase: writers append as fast as they can, checkpointing now and then.

Figures: changes/s, MB/s, objects, CPU of the server and the writers, RSS
(flat or growing), and the store's own throughput for the same bytes.
"""

from __future__ import annotations

import shutil
from typing import Any

from loadtest.baseline import store_throughput
from loadtest.bench.config import FLAT_RSS_FACTOR, FLAT_RSS_SLACK, MiB
from loadtest.bench.measure import percentiles, persist_histogram, say
from loadtest.bench.processes import plans, run_writers
from loadtest.bench.target import BenchTarget
from loadtest.writer_proc import WAIT_TIMEOUT_S, WriterPlan


def append_phase(t: BenchTarget, name: str, change_bytes: int) -> dict[str, Any]:
    """One append run with ``change_bytes`` changes; its figures (a report's ``append[]`` entry)."""
    cfg = t.cfg
    job = f"bench-append-{change_bytes}"
    writers = cfg.processes * cfg.threads
    say(
        f"[append/{name}] {writers} writers in {cfg.processes} processes, "
        f"{change_bytes} B changes, {cfg.duration_s:g}s ..."
    )
    base = WriterPlan(
        target=t.server.address,
        job_id=job,
        mode="stream",
        first_writer=0,
        threads=0,
        change_bytes=change_bytes,
        batch_bytes=cfg.batch_bytes,
        duration_s=cfg.duration_s,
        checkpoint_interval_s=cfg.checkpoint_interval_s,
        transport=cfg.transport,
    )
    before = t.scrape()
    results = run_writers(plans(base, writers, cfg.processes), cfg.duration_s + 2 * WAIT_TIMEOUT_S)
    delta = t.scrape().minus(before)
    started = min(r.started for r in results)
    finished = max(r.finished for r in results)
    seconds = finished - started
    cpu_cores = t.rss.cpu_cores(started, finished)
    client_cores = sum(r.process_cpu_s for r in results) / seconds
    changes = sum(r.changes for r in results)
    payload = sum(r.payload_bytes for r in results)
    uploads = delta.total("dstl_uploads_total", result="ok")
    upload_bytes = delta.total("dstl_upload_bytes_total")
    mean_object = upload_bytes / uploads if uploads else 0.0
    rss = t.rss.window(started, finished)
    half = len(rss) // 2
    first_peak = max(rss[:half], default=0)
    second_peak = max(rss[half:], default=0)
    flat = second_peak <= first_peak * FLAT_RSS_FACTOR + FLAT_RSS_SLACK
    shutil.rmtree(t.objects_dir(job), ignore_errors=True)

    say(f"[append/{name}] baseline: {upload_bytes / 1e6:,.0f} MB straight to the store ...")
    baseline = store_throughput(
        t.root / "baseline",
        fsync=cfg.fsync,
        total_bytes=int(upload_bytes),
        object_bytes=int(mean_object),
        concurrency=t.upload_slots,
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
        "persist_under_load_ms": percentiles(persist_histogram(results)),
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
            "concurrency": t.upload_slots,
        },
        # stored bytes per second, service over store: 1.0 = no overhead
        "ratio_to_store": round(stored_mb_per_s / baseline.mb_per_s, 3)
        if baseline.mb_per_s
        else 0.0,
    }
    say(
        f"[append/{name}] {out['changes_per_s']:,.0f} changes/s, {mb_per_s:,.1f} MB/s; "
        f"store alone {baseline.mb_per_s:,.1f} MB/s; peak RSS {max(rss, default=0) / MiB:,.0f} MiB"
    )
    return out
