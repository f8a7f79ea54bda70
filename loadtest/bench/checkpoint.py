"""The checkpoint phase: W writers in lockstep rounds, all persisting together.

Figures: persist latency (client side), objects per flush, distinct objects
per round, how far apart the calls of a round were, and the latency the
service adds over the store's own put latency.
"""

from __future__ import annotations

import shutil
from typing import Any

from loadtest.baseline import store_put_latency
from loadtest.bench.measure import percentiles, persist_histogram, say
from loadtest.bench.processes import plans, run_writers
from loadtest.bench.target import BenchTarget
from loadtest.writer_proc import WAIT_TIMEOUT_S, WriterPlan


def checkpoint_phase(t: BenchTarget, writers: int) -> dict[str, Any]:
    """One checkpoint run with ``writers`` writers; its figures (a ``checkpoint[]`` entry)."""
    cfg = t.cfg
    job = f"bench-ckpt-{writers}"
    processes = min(cfg.max_processes, writers)
    say(
        f"[checkpoint/{writers}] {writers} writers in {processes} processes, "
        f"{cfg.rounds} rounds of {cfg.round_bytes} B per writer ..."
    )
    base = WriterPlan(
        target=t.server.address,
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
        transport=cfg.transport,
    )
    before, cpu0 = t.scrape(), t.cpu_s()
    results = run_writers(plans(base, writers, processes), cfg.rounds * 5.0 + 2 * WAIT_TIMEOUT_S)
    delta, cpu_s = t.scrape().minus(before), t.cpu_s() - cpu0
    shutil.rmtree(t.objects_dir(job), ignore_errors=True)
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
    persist = percentiles(persist_histogram(results))
    mean_object = int(upload_bytes / objects) if objects else 0
    puts = max(cfg.rounds, cfg.min_baseline_puts)
    say(f"[checkpoint/{writers}] baseline: {puts} puts of {mean_object:,} B ...")
    put_hist = store_put_latency(
        t.root / "baseline", fsync=cfg.fsync, object_bytes=mean_object, count=puts
    )
    put = percentiles(put_hist)
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
        "server_cpu_us_per_persist": round(cpu_s / cfg.rounds / writers * 1e6, 1),
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
        # writer stream messages (Session or Mux) per persist, each way: 0 for unary
        "stream_messages_per_persist": {
            way: round(delta.total("dstl_stream_messages_total", direction=way) / srv_count, 3)
            if srv_count
            else 0.0
            for way in ("in", "out")
        },
    }
    say(
        f"[checkpoint/{writers}] persist p50 {persist['p50']:.2f} ms p99 {persist['p99']:.2f} ms"
        f" p99.9 {persist['p999']:.2f} ms; store put p50 {put['p50']:.2f} ms;"
        f" {out['objects_per_flush']} object(s)/flush, {out['flushes_per_round']} flush(es)/round;"
        f" stream messages per persist {out['stream_messages_per_persist']}"
    )
    return out
