"""The recovery benchmark's settings (every default in one place) and its goals."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dstl_client.coordinator.config import CheckpointSettings
from loadtest.mat_bench import goal_mb_s

DEFAULT_REPORT_DIR = Path(__file__).resolve().parents[1] / "reports"

#: goal: restore with the longest changelog tail at most this many times the full snapshot's
GOAL_TAIL_RATIO = 1.2
#: goal: materialization through one node, MB/s (10^6 bytes of stored object per second):
#: this machine's, as ``make bench-mat`` judges it (150 on 2 cores, 200 on 16)
GOAL_MAT_MB_S = goal_mb_s()
#: goal: with the default settings, restore at these tails at most GOAL_TAIL_RATIO x full
GOAL_DEFAULT_TAILS = (10, 100)
#: the job options' defaults of the tail bound (defined there, read here)
DEFAULT_TAIL_RATIO = CheckpointSettings().materialize_tail_ratio
DEFAULT_TAIL_MIN_BYTES = CheckpointSettings().materialize_tail_min_bytes
#: the sweep of ``materialize_tail_ratio`` (0, by time only, is the run without a ratio)
SWEEP_TAIL_RATIOS = (0.05, 0.1, 0.2, 0.3, 0.5)
#: the sizes the issue asks for (run them with --keys)
ISSUE_KEYS = (1_000_000, 10_000_000)


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What one run measures. Frozen."""

    #: keys of state (one ValueState row each)
    keys: int = 300_000
    #: bytes of each key's value
    value_bytes: int = 100
    #: share of the keys each update checkpoint rewrites
    update_fraction: float = 0.01
    #: changelog tails measured: checkpoints since the last materialization (ascending)
    tails: tuple[int, ...] = (0, 10, 100)
    #: the job's parallelism (subtask processes) while it builds the state
    job_parallelism: int = 2
    #: restore parallelisms: one subtask and the whole job at each
    restore_parallelisms: tuple[int, ...] = (2, 4)
    #: keys written per batch while loading the state (batches before the materialization)
    load_batch_keys: int = 250_000
    max_parallelism: int = 128
    seed: int = 7
    #: run the Spark RocksDB job (c)
    spark: bool = True
    #: restore of the whole job at each parallelism, repeated (the best is reported)
    repeat: int = 1
    driver_memory: str = "3g"
    #: the sidecar's read cache (None: the server's default). The restores read
    #: through the sidecar that wrote the changelog: with the cache they measure a
    #: restore on the writing node, with 0 one on another node (every read from S3)
    read_cache_bytes: int | None = None
    #: ``materialize_tail_ratio`` of one more job each (restored at the goal's
    #: parallelism): the curve of restore time and upload volume against the ratio
    #: (the default ratio is always among them: the goal is judged on it)
    tail_ratios: tuple[float, ...] = SWEEP_TAIL_RATIOS
    #: ``materialize_tail_min_bytes`` of the sweep's jobs (a tiny state needs 0 to
    #: see the ratio at work)
    tail_min_bytes: int = DEFAULT_TAIL_MIN_BYTES

    @property
    def sweep(self) -> tuple[float, ...]:
        """The ratios run as jobs of their own: ``tail_ratios`` and the default, ascending."""
        return tuple(sorted({r for r in (*self.tail_ratios, DEFAULT_TAIL_RATIO) if r > 0}))

    @property
    def max_tail(self) -> int:
        return max(self.tails)

    @property
    def state_bytes(self) -> int:
        """Bytes of keys and values of the state (the logical size)."""
        return self.keys * (12 + self.value_bytes)
