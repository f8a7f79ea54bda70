"""The chaos bench's settings and their defaults (:class:`ChaosConfig`), and the short preset."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from loadtest.chaos_bench.schedule import FaultKind, ScheduleSpec

DEFAULT_REPORT_DIR = Path(__file__).resolve().parents[1] / "reports"


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """One run: rounds of the keyed job, each under its own schedule, until ``minutes`` pass.

    A round is a fresh 2-node cluster, a fresh job and a fresh input; round
    ``r``'s schedule is ``schedule.draw(seed, r, spec)``. A next round starts
    only while at least the previous round's duration is left, so a run ends
    within about ``minutes`` (one round always runs).
    """

    seed: int = 1
    minutes: float = 30.0
    #: at most this many rounds (0: as many as ``minutes`` allow)
    rounds: int = 0
    #: input files per round (one per batch, unless Spark merges two)
    batches: int = 30
    rows: int = 400
    keys: int = 240
    nodes: int = 2
    parallelism: int = 2
    parallelism_choices: tuple[int, ...] = (1, 2, 3, 4)
    process_faults: int = 6
    s3_windows: int = 4
    kinds: tuple[FaultKind, ...] = tuple(FaultKind)
    first_batch: int = 2
    end_margin: int = 3
    min_gap: int = 3
    s3_rate: tuple[float, float] = (0.1, 0.3)
    s3_duration_s: tuple[float, float] = (10.0, 30.0)
    stall_ms: int = 2000
    #: a killed sidecar (or driver) is started again this long after the kill
    sidecar_down_s: float = 1.0
    driver_down_s: float = 1.0
    #: a killed node's worker and sidecar start again this long after the kill
    node_down_s: float = 3.0
    #: no batch recorded for this long fails the round
    stall_timeout_s: float = 420.0
    #: driver exits nobody caused (the job gave up under faults) a round tolerates, each
    #: followed by a new driver; one more fails the round
    max_unplanned_exits: int = 4
    #: options for every JVM of a round's cluster and its drivers (see
    #: :mod:`loadtest.spark_cluster`); "" (the bench): the JVM's defaults
    jvm_options: str = ""

    def spec(self) -> ScheduleSpec:
        """The schedule spec of every round (validates the schedule settings)."""
        return ScheduleSpec(
            batches=self.batches,
            nodes=self.nodes,
            parallelism=self.parallelism,
            parallelism_choices=self.parallelism_choices,
            process_faults=self.process_faults,
            s3_windows=self.s3_windows,
            kinds=self.kinds,
            first_batch=self.first_batch,
            end_margin=self.end_margin,
            min_gap=self.min_gap,
            s3_rate=self.s3_rate,
            s3_duration_s=self.s3_duration_s,
            stall_ms=self.stall_ms,
        )


def short_config(base: ChaosConfig | None = None) -> ChaosConfig:
    """The variant ``make test`` runs: one small round, a fixed seed, a few faults.

    A sidecar SIGKILL, a driver SIGKILL with its restart on a fresh disk,
    and a window of S3 503s and resets (both kinds in one window would be two
    windows: one of each, short).
    """
    return replace(
        base or ChaosConfig(),
        seed=7,
        minutes=0.0,
        rounds=1,
        batches=10,
        rows=200,
        keys=240,
        process_faults=2,
        s3_windows=2,
        kinds=(
            FaultKind.SIDECAR_KILL,
            FaultKind.DRIVER_KILL,
            FaultKind.S3_503,
            FaultKind.S3_RESET,
        ),
        first_batch=1,
        end_margin=2,
        min_gap=3,
        s3_rate=(0.25, 0.4),
        s3_duration_s=(8.0, 12.0),
        stall_timeout_s=420.0,
    )
