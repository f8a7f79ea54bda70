"""The benchmark's settings (every default in one place) and Flink's published figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_REPORT_DIR = Path(__file__).resolve().parents[1] / "reports"

#: FLIP-140's measurements of ``ValueState`` operations, ops/ms (Java, JMH), as published
FLINK_PUBLISHED: dict[str, tuple[float, float, float]] = {
    "HEAP": (9206, 12718, 12916),
    "ROCKSDB": (652, 1621, 941),
    "SINGLE_KEY": (18282, 30861, 32883),
}
#: the operations, in the order of Flink's table
OPS = ("add", "get", "update")
#: the job's goal: sorted mode at least this many times faster than the keyed backend
GOAL_SPEEDUP = 2.0


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What one run measures. Frozen."""

    # (a) the micro-benchmark
    micro: bool = True
    #: operations timed per measurement
    micro_ops: int = 200_000
    #: keys with state before the keyed backend's get/update (Flink's benchmark: 500 000)
    micro_setup_keys: int = 500_000
    #: measurements per backend and operation (the median is reported)
    micro_rounds: int = 3
    # (b) the WordCount job
    job: bool = True
    #: input records
    records: int = 4_000_000
    #: distinct words (every one occurs)
    keys: int = 400_000
    #: Parquet files of the input
    files: int = 8
    #: partitions / subtasks of both jobs; also the local Spark cores
    parallelism: int = 2
    #: records of the warm-up run of each mode (JVM and Python workers), untimed
    warmup_records: int = 100_000
    #: timed runs of each mode, interleaved (the best is compared: other load on the
    #: machine only ever slows a run down)
    repeat: int = 3
    driver_memory: str = "3g"
