"""What a benchmark run depends on (:class:`BenchConfig`) and the targets it is judged by."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: loadtest/reports
DEFAULT_REPORT_DIR = Path(__file__).resolve().parents[1] / "reports"
MiB = 1 << 20

# the sidecar's targets (README, Benchmarks)
TARGET_MB_PER_S = 200.0
TARGET_CHANGES_PER_S = 1_000_000.0
#: added persist latency with TARGET_WRITERS writers: on a machine of at least
#: LATENCY_CORES cores (p50 < 5 ms, p99 < 20 ms), and on fewer, where 64 writers' and the
#: sidecar's CPU share the cores, at most 15 / 30 ms (the hot-path issue's 2-core goals)
LATENCY_CORES = 16
TARGET_ADDED_P50_MS = 5.0
TARGET_ADDED_P99_MS = 20.0
TARGET_ADDED_P50_MS_FEW_CORES = 15.0
TARGET_ADDED_P99_MS_FEW_CORES = 30.0
#: server CPU per persist with TARGET_WRITERS writers (its append, persist and upload share)
TARGET_CPU_US_PER_PERSIST = 300.0
#: flushes per checkpoint round with TARGET_WRITERS writers, at most (a round whose
#: persists spread over more than the server's persist_max_wait_ms leaves in two objects)
TARGET_FLUSHES_PER_ROUND = 1.1
TARGET_WRITERS = 64
#: RSS counts as flat when the second half of a run peaks at most this much above the first
FLAT_RSS_FACTOR = 1.10
FLAT_RSS_SLACK = 16 * MiB


class BenchError(RuntimeError):
    """A writer or the server failed; the run has no valid figures."""


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything a run depends on (recorded in the report). Frozen: share it freely."""

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
    #: how the writers' clients send their calls: "stream" (the client's default) or "unary"
    transport: str = "stream"
    quick: bool = False


#: what ``--quick`` changes (a few seconds per phase)
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
