"""The random fault schedule of one round, drawn from a seed: pure, no clock, no I/O.

:func:`draw` turns ``(seed, round, spec)`` into a :class:`Schedule`, the
same one for the same arguments on any machine (``random.Random`` seeded
with a string is stable across Python versions and platforms). A schedule
holds two kinds of :class:`Fault`:

* **process faults** (:data:`PROCESS_KINDS`): a sidecar SIGKILLed and
  started again on its address, an executor SIGKILLed (its worker starts
  another), a whole node SIGKILLed and started again, the driver SIGKILLed
  and started again on a fresh disk, and a rescale (the driver SIGKILLed and
  started again with another parallelism). The runner injects them one at a
  time, each after the previous one has recovered;
* **S3 windows** (:data:`S3_KINDS`): for ``duration_s`` seconds the fault
  proxy answers a share ``rate`` of requests with ``503 SlowDown``, resets
  their connection, or stalls them ``stall_ms``. Windows may overlap each
  other and the process faults.

Each fault is armed once batch ``at_batch`` is planned and fires
``delay_frac`` of a median batch later. Every kind the spec allows appears
at least once in a round whose fault counts leave room for it; process
faults are at least ``min_gap`` batches apart, and nothing is scheduled in
the first ``first_batch`` or the last ``end_margin`` batches.

Frozen values and pure functions: any thread.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum


class FaultKind(StrEnum):
    """What a fault does (the names the schedule and the report print)."""

    SIDECAR_KILL = "sidecar-kill"
    EXECUTOR_KILL = "executor-kill"
    NODE_KILL = "node-kill"
    DRIVER_KILL = "driver-kill"
    RESCALE = "rescale"
    S3_503 = "s3-503"
    S3_RESET = "s3-reset"
    S3_STALL = "s3-stall"


PROCESS_KINDS = (
    FaultKind.SIDECAR_KILL,
    FaultKind.EXECUTOR_KILL,
    FaultKind.NODE_KILL,
    FaultKind.DRIVER_KILL,
    FaultKind.RESCALE,
)
S3_KINDS = (FaultKind.S3_503, FaultKind.S3_RESET, FaultKind.S3_STALL)
ALL_KINDS = PROCESS_KINDS + S3_KINDS
#: the target of a sidecar kill on the driver's node
DRIVER_NODE = "driver"
PHASES = ("request", "response")


class ScheduleError(ValueError):
    """A schedule spec that cannot be satisfied (too few batches for its faults)."""


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a round's schedule may hold; validated when built (:class:`ScheduleError`)."""

    #: input files of the round (one per batch, unless Spark merges two)
    batches: int
    nodes: int = 2
    #: the first driver's parallelism
    parallelism: int = 2
    #: a rescale picks one of these (not the current one)
    parallelism_choices: tuple[int, ...] = (1, 2, 3, 4)
    process_faults: int = 5
    s3_windows: int = 3
    kinds: tuple[FaultKind, ...] = ALL_KINDS
    #: no fault is armed before this batch (executors and Python workers start up)
    first_batch: int = 2
    #: nor in the last this many batches (the recovery must be seen)
    end_margin: int = 3
    #: process faults are at least this many batches apart
    min_gap: int = 3
    s3_rate: tuple[float, float] = (0.05, 0.25)
    s3_duration_s: tuple[float, float] = (8.0, 25.0)
    stall_ms: int = 2000

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise ScheduleError("nodes must be at least 2 (a killed node needs a survivor)")
        if not self.kinds or any(k not in ALL_KINDS for k in self.kinds):
            raise ScheduleError(f"kinds must be some of {[str(k) for k in ALL_KINDS]}")
        if self.process_faults < 0 or self.s3_windows < 0 or self.min_gap < 1:
            raise ScheduleError("process_faults, s3_windows >= 0; min_gap >= 1")
        if self.process_faults and not self.process_kinds:
            raise ScheduleError("process_faults > 0 but no process fault kind is allowed")
        if self.s3_windows and not self.s3_kinds:
            raise ScheduleError("s3_windows > 0 but no S3 fault kind is allowed")
        if FaultKind.RESCALE in self.kinds and not set(self.parallelism_choices) - {
            self.parallelism
        }:
            raise ScheduleError("a rescale needs a parallelism choice other than the first")
        if self.parallelism < 1 or any(p < 1 for p in self.parallelism_choices):
            raise ScheduleError("parallelism must be >= 1")
        lo, hi = self.s3_rate
        if not 0 < lo <= hi <= 0.5:
            raise ScheduleError("s3_rate must be 0 < low <= high <= 0.5")
        if not 0 < self.s3_duration_s[0] <= self.s3_duration_s[1]:
            raise ScheduleError("s3_duration_s must be 0 < low <= high")
        if self.first_batch < 0 or self.end_margin < 1:
            raise ScheduleError("first_batch >= 0, end_margin >= 1")
        room = self.window - (self.process_faults - 1) * (self.min_gap - 1)
        if self.window < 1 or (self.process_faults and room < self.process_faults):
            raise ScheduleError(
                f"{self.batches} batches leave no room for {self.process_faults} process "
                f"faults {self.min_gap} batches apart between batch {self.first_batch} and "
                f"the last {self.end_margin}"
            )

    @property
    def window(self) -> int:
        """Batches a fault may be armed at: ``first_batch .. batches - end_margin - 1``."""
        return self.batches - self.end_margin - self.first_batch

    @property
    def process_kinds(self) -> tuple[FaultKind, ...]:
        return tuple(k for k in PROCESS_KINDS if k in self.kinds)

    @property
    def s3_kinds(self) -> tuple[FaultKind, ...]:
        return tuple(k for k in S3_KINDS if k in self.kinds)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a schedule (see the module docstring). Frozen."""

    kind: FaultKind
    #: armed once this batch is planned
    at_batch: int
    #: fires this fraction of a median batch after that, in ``[0, 1)``
    delay_frac: float
    #: the node (``node0``...) of a sidecar, executor or node kill; ``driver``: the
    #: driver node's sidecar
    target: str = ""
    #: a rescale's new parallelism
    parallelism: int = 0
    #: an S3 window's share of requests affected
    rate: float = 0.0
    duration_s: float = 0.0
    #: an S3 reset or stall: before forwarding (``request``) or after the upstream
    #: answered (``response``: the request took effect, the client cannot tell)
    phase: str = "request"
    stall_ms: int = 0

    @property
    def is_s3(self) -> bool:
        return self.kind in S3_KINDS

    def describe(self) -> str:
        where = f"batch {self.at_batch} +{self.delay_frac:.2f}"
        k = self.kind
        if k is FaultKind.RESCALE:
            return f"{where}: rescale to parallelism {self.parallelism}"
        if k in (FaultKind.SIDECAR_KILL, FaultKind.EXECUTOR_KILL, FaultKind.NODE_KILL):
            return f"{where}: {k} {self.target}"
        if k is FaultKind.DRIVER_KILL:
            return f"{where}: {k} (restart on a fresh disk)"
        what = {
            FaultKind.S3_503: "503 SlowDown",
            FaultKind.S3_RESET: f"connection reset ({self.phase})",
            FaultKind.S3_STALL: f"{self.stall_ms / 1000:g} s stall ({self.phase})",
        }[k]
        return f"{where}: {k}: {what} for {self.rate:.0%} of S3 requests, {self.duration_s:.0f} s"


@dataclass(frozen=True, slots=True)
class Schedule:
    """The faults of one round, ordered by when they are armed. Frozen."""

    seed: int
    round: int
    #: the first driver's parallelism
    parallelism: int
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    @property
    def process_faults(self) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if not f.is_s3)

    @property
    def s3_windows(self) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.is_s3)

    def counts(self) -> Counter[FaultKind]:
        return Counter(f.kind for f in self.faults)

    def lines(self) -> list[str]:
        head = (
            f"round {self.round} (seed {self.seed}): {len(self.faults)} faults, "
            f"parallelism {self.parallelism} at the start"
        )
        return [head, *(f"  {f.describe()}" for f in self.faults)]


def _kinds(rng: random.Random, allowed: tuple[FaultKind, ...], n: int) -> list[FaultKind]:
    """``n`` kinds: each allowed kind once (a random subset if ``n`` is smaller), then random."""
    if n <= len(allowed):
        return rng.sample(list(allowed), n)
    picked = list(allowed) + [rng.choice(allowed) for _ in range(n - len(allowed))]
    rng.shuffle(picked)
    return picked


def draw(seed: int, round_index: int, spec: ScheduleSpec) -> Schedule:
    """The schedule of round ``round_index`` of the run with ``seed`` (pure, deterministic)."""
    rng = random.Random(f"dstl-chaos:{seed}:{round_index}")
    nodes = [f"node{i}" for i in range(spec.nodes)]
    faults: list[Fault] = []

    # process faults: sorted positions at least min_gap apart inside the window
    n = spec.process_faults
    room = spec.window - (n - 1) * (spec.min_gap - 1) if n else 0
    offsets = sorted(rng.sample(range(room), n)) if n else []
    current = spec.parallelism
    for i, (off, kind) in enumerate(zip(offsets, _kinds(rng, spec.process_kinds, n), strict=True)):
        at = spec.first_batch + off + i * (spec.min_gap - 1)
        frac = rng.random()
        if kind is FaultKind.RESCALE:
            current = rng.choice(sorted(set(spec.parallelism_choices) - {current}))
            faults.append(Fault(kind, at, frac, parallelism=current))
        elif kind is FaultKind.SIDECAR_KILL:
            faults.append(Fault(kind, at, frac, target=rng.choice([*nodes, DRIVER_NODE])))
        elif kind is FaultKind.DRIVER_KILL:
            faults.append(Fault(kind, at, frac))
        else:
            faults.append(Fault(kind, at, frac, target=rng.choice(nodes)))

    for kind in _kinds(rng, spec.s3_kinds, spec.s3_windows):
        at = spec.first_batch + rng.randrange(spec.window)
        faults.append(
            Fault(
                kind,
                at,
                rng.random(),
                rate=round(rng.uniform(*spec.s3_rate), 3),
                duration_s=round(rng.uniform(*spec.s3_duration_s), 1),
                phase="request" if kind is FaultKind.S3_503 else rng.choice(PHASES),
                stall_ms=spec.stall_ms if kind is FaultKind.S3_STALL else 0,
            )
        )
    faults.sort(key=lambda f: (f.at_batch, f.delay_frac))
    return Schedule(seed, round_index, spec.parallelism, tuple(faults))
