"""The benchmark's settings and their defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_REPORT_DIR = Path(__file__).resolve().parents[1] / "reports"
#: a batch slower than this many times the median batch has not recovered
RECOVERED_FACTOR = 1.5


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One run: every node count in ``nodes`` on a fresh cluster, the same workload."""

    nodes: tuple[int, ...] = (2, 3)
    #: batches per node count (input files, one per trigger)
    batches: int = 60
    rows: int = 5000
    keys: int = 2000
    #: a random live node is killed every this many batches
    kill_every_batches: int = 10
    #: the killed node's worker and sidecar start again this long after the kill
    restart_after_s: float = 3.0
    seed: int = 1
    #: Spark tasks (key-group ranges) per batch
    parallelism: int = 4
    #: first batches left out of the figures (executor and Python worker start-up)
    warmup_batches: int = 3
    #: no batch recorded for this long fails the run
    stall_timeout_s: float = 300.0
    #: a driver that exits before the last batch is started again at most this often
    max_driver_restarts: int = 2
    #: options for every JVM of the clusters and their drivers (see
    #: :mod:`loadtest.spark_cluster`); "": the JVM's defaults
    jvm_options: str = ""
