"""The benchmark's settings (every default in one place)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_REPORT_DIR = Path(__file__).resolve().parents[1] / "reports"

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: the engines, in the order they run
ENGINES = ("tws", "apply", "dstl")
ENGINE_NAMES = {
    "tws": "Spark transformWithStateInPandas (RocksDB)",
    "apply": "Spark applyInPandasWithState (RocksDB)",
    "dstl": "dstl transform_with_state",
}
#: goal: dstl's median batch at least this many times shorter than transformWithStateInPandas'
GOAL_SPEEDUP = 10.0
#: goal: dstl's checkpoint median over the last third of the batches at most this many
#: times its median over the first third
GOAL_FLAT = 1.5


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What one run measures. Frozen."""

    #: distinct keys after the last batch (each batch adds keys / batches new ones)
    keys: int = 100_000
    #: input rows per batch (the new keys once each, the rest on random earlier keys)
    rows: int = 20_000
    #: micro-batches (Parquet files)
    batches: int = 10
    #: first batches left out of the statistics (Python workers start, JIT, stores open)
    warmup: int = 1
    #: local Spark cores and shuffle partitions (state partitions)
    parallelism: int = 2
    engines: tuple[str, ...] = ENGINES
    driver_memory: str = "3g"
    #: seconds one engine may take before its query is stopped
    timeout_s: float = 600.0
    seed: int = 7

    @property
    def new_per_batch(self) -> int:
        return self.keys // self.batches
