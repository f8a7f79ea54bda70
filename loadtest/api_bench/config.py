"""The benchmark's settings (every default, preset and goal in one place)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_REPORT_DIR = Path(__file__).resolve().parents[1] / "reports"

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
#: every engine, in the order they run (each in its own process)
ENGINES = ("tws", "apply", "dstl", "vec", "jvm")
ENGINE_NAMES = {
    "tws": "Spark transformWithStateInPandas (RocksDB)",
    "apply": "Spark applyInPandasWithState (RocksDB)",
    "dstl": "dstl transform_with_state (per-key processor)",
    "vec": "dstl transform_batches (vectorized)",
    "jvm": "Spark JVM groupBy().agg() (RocksDB; the ceiling)",
}
#: engines whose state is Spark's (the RocksDB provider, changelog checkpointing on)
SPARK_STATE_ENGINES = ("tws", "apply", "jvm")
#: engines that run over a dstl sidecar
SIDECAR_ENGINES = ("dstl", "vec")

#: goal (issue 20): vectorized median batch at least this many times shorter than
#: transformWithStateInPandas'
GOAL_VEC_VS_TWS = 30.0
#: goal (issue 20): ... and than dstl's own per-key processor's
GOAL_VEC_VS_PROCESSOR = 10.0
#: goal (issue 20): vectorized median batch at most this many times the JVM aggregation's
GOAL_VEC_VS_JVM = 2.0
#: goal (issue 12): the per-key processor at least this many times faster than
#: transformWithStateInPandas
GOAL_SPEEDUP = 10.0
#: goal: a dstl engine's checkpoint median over the last third of the batches at most
#: this many times its median over the first third
GOAL_FLAT = 1.5
#: goal (issue 20, large preset): the vectorized state read + write per touched key,
#: last third of the batches over the first third, at most this
GOAL_TOUCHED = 1.5


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
    engines: tuple[str, ...] = ("tws", "dstl", "vec", "jvm")
    driver_memory: str = "3g"
    #: seconds one engine may take before its query is stopped
    timeout_s: float = 900.0
    seed: int = 7
    preset: str = "default"

    @property
    def new_per_batch(self) -> int:
        return self.keys // self.batches

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchConfig:
        raw: dict[str, Any] = json.loads(text)
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known
        }
        return cls(**kw)


#: ``--preset``: the issue's job (100 k keys, 20 k rows per batch, all four engines) and
#: the large one (1 M keys, 100 k rows per batch: 50 k new keys and 50 k rows on earlier
#: keys per batch; the engines a Python call per key would keep busy for an hour are
#: left out unless ``--engines`` names them)
PRESETS = {
    "default": BenchConfig(),
    "large": BenchConfig(
        keys=1_000_000,
        rows=100_000,
        batches=20,
        warmup=1,
        engines=("vec", "jvm"),
        driver_memory="4g",
        timeout_s=1800.0,
        preset="large",
    ),
}


def preset(name: str, **overrides: Any) -> BenchConfig:
    """The preset ``name`` with the ``overrides`` that are not None."""
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})
