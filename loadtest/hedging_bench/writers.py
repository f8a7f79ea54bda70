"""Writer processes of the hedging benchmark: each loops append, persist, sometimes truncate.

A process opens one client (as a PySpark worker would) and runs one thread
per writer; it puts one ``(index, WriterStats)`` result per writer on the
queue, also for a writer that failed (``error`` set).
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dstl_client import ChangelogClient
from loadtest.hedging_bench.config import WAIT_TIMEOUT_S, BenchConfig


@dataclass(slots=True)
class WriterStats:
    """What one writer measured. Written only by that writer's thread; read by the
    process after the thread ended (then sent to the parent as a dict)."""

    persists: int = 0
    latencies_us: list[int] = field(default_factory=list)
    error: str | None = None


def writer_loop(
    client: ChangelogClient, cfg: BenchConfig, index: int, start: float, out: WriterStats
) -> None:
    """Writer ``index``: from ``start`` (monotonic) checkpoint until the run ends; into ``out``."""
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


def process_main(
    target: str, cfg: BenchConfig, indexes: Sequence[int], start: float, results: Any
) -> None:
    """One writer process: a client, one thread per writer; puts one result per writer."""
    stats = {i: WriterStats() for i in indexes}
    with ChangelogClient(target) as client:

        def run(i: int) -> None:
            try:
                writer_loop(client, cfg, i, start, stats[i])
            except BaseException as exc:
                stats[i].error = f"writer {i}: {exc!r}\n{traceback.format_exc(limit=4)}"

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in indexes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(cfg.warmup_s + cfg.duration_s + WAIT_TIMEOUT_S)
    for i in indexes:
        results.put((i, asdict(stats[i])))
