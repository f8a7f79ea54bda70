"""What a hedging benchmark run depends on (:class:`BenchConfig`) and its goal."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.s3fault import FaultConfig

#: loadtest/reports
DEFAULT_REPORT_DIR = Path(__file__).resolve().parents[1] / "reports"
MODES = ("off", "fixed", "adaptive")
TARGET_P999_CUT = 0.5
TARGET_EXTRA = 0.05
LATENCY_MAX_US = 3_600_000_000
WAIT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything a run depends on (recorded in the report). Frozen: share it freely
    (it is pickled to every writer process)."""

    writers: int = 64
    processes: int = 4
    duration_s: float = 60.0
    warmup_s: float = 5.0
    changes_per_checkpoint: int = 4
    change_bytes: int = 1024
    think_ms: float = 50.0
    truncate_every: int = 10
    tail_rate: float = 0.02
    tail_min_ms: float = 1000.0
    tail_max_ms: float = 2000.0
    fixed_delay_ms: float = 200.0
    hedge_quantile: float = 0.95
    hedge_min_delay_ms: float = 50.0
    hedge_max_delay_ms: float = 2000.0
    hedge_budget_fraction: float = 0.05
    persist_delay_ms: float = 10.0
    modes: tuple[str, ...] = MODES
    seed: int = 42
    quick: bool = False

    def faults(self) -> FaultConfig:
        return FaultConfig.from_dict(
            {
                "latency": {
                    "rate": self.tail_rate,
                    "dist": "uniform",
                    "min_ms": self.tail_min_ms,
                    "max_ms": self.tail_max_ms,
                },
                "methods": ["PUT"],
            }
        )

    def server_args(self, mode: str) -> list[str]:
        return [
            "--hedge-mode", mode,
            "--hedge-delay-ms", str(self.fixed_delay_ms),
            "--hedge-quantile", str(self.hedge_quantile),
            "--hedge-min-delay-ms", str(self.hedge_min_delay_ms),
            "--hedge-max-delay-ms", str(self.hedge_max_delay_ms),
            "--hedge-budget-fraction", str(self.hedge_budget_fraction),
            "--persist-delay-ms", str(self.persist_delay_ms),
        ]  # fmt: skip


QUICK: dict[str, Any] = {"writers": 16, "processes": 2, "duration_s": 6.0, "warmup_s": 1.5}
