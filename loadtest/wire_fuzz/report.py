"""What a fuzz run found: its violations (one example each), its counters, the verdicts."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from loadtest.wire_fuzz.encoding import clip
from loadtest.wire_fuzz.settings import (
    CALL_TIMEOUT_S,
    HEALTH_TIMEOUT_S,
    INVARIANTS,
    FuzzSettings,
    MiB,
)


@dataclass(slots=True)
class Violation:
    """The first example of one kind of violation, and how often that kind happened.

    Created and counted only under the run's lock (``RunState.violate``).
    """

    invariant: str
    what: str
    request: str
    seed: int
    worker: int
    call_no: int
    at_s: float
    context: list[str] = field(default_factory=list)
    count: int = 1

    def render(self) -> str:
        lines = [
            f"  [{self.invariant}] x{self.count} {self.what}",
            f"      request: {clip(self.request)}",
            f"      first at {self.at_s:.1f}s, worker {self.worker}, call {self.call_no}, "
            f"seed {self.seed} (rerun: python -m loadtest.wire_fuzz --seed {self.seed})",
        ]
        lines += [f"      {clip(c, 400)}" for c in self.context]
        return "\n".join(lines)


def signature(invariant: str, method: str, what: str) -> str:
    """Violations with one signature are one kind (numbers and hex ids left out)."""
    norm = re.sub(r"[0-9a-f]{8,}|\d+", "#", what)
    return f"{invariant}|{method}|{norm[:90]}"


@dataclass
class FuzzReport:
    """The result of :func:`~loadtest.wire_fuzz.run_fuzz`.

    While the run lasts it is written only under the run's lock (by workers
    and the monitor); once ``run_fuzz`` returned it is the caller's alone.
    """

    seed: int
    settings: FuzzSettings
    duration_s: float = 0.0
    calls: int = 0
    by_method: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    seconds_by_method: dict[str, float] = field(default_factory=dict)
    violations: dict[str, Violation] = field(default_factory=dict)
    violation_counts: Counter[str] = field(default_factory=Counter)
    dropped_violations: int = 0
    health_checks: int = 0
    #: answer times of the monitor's successful health checks (seen by the fuzzer)
    health_latencies: list[float] = field(default_factory=list)
    rss_start: int = 0
    rss_peak: int = 0
    rss_bound: int = 0
    rss_checked: bool = False
    bystander_ok: bool | None = None
    bystander_detail: str = ""
    stopped_early: str = ""
    fuzzer_errors: list[str] = field(default_factory=list)

    def invariant_results(self) -> list[tuple[str, bool | None, str]]:
        """(invariant, passed (None: not checked), detail) for each invariant."""
        out: list[tuple[str, bool | None, str]] = []
        for name in INVARIANTS:
            n = self.violation_counts[name]
            distinct = sum(1 for v in self.violations.values() if v.invariant == name)
            if name == "rss" and not self.rss_checked:
                out.append((name, None, "server pid unknown: not checked"))
                continue
            if name == "bystander" and self.bystander_ok is None:
                out.append((name, None, self.bystander_detail or "not run"))
                continue
            if name == "bystander":
                out.append((name, bool(self.bystander_ok), self.bystander_detail))
                continue
            detail = {
                "typed-errors": f"{self.calls} calls, OK or typed error",
                "call-bound": f"every call answered within {CALL_TIMEOUT_S:g}s",
                "call-order": "no ordered writer told a call of it was lost",
                "health": f"{self.health_checks} checks, SERVING within {HEALTH_TIMEOUT_S:g}s "
                f"(answers seen: {self._health_figures()})",
                "rss": f"start {self.rss_start / MiB:.0f} MiB, peak {self.rss_peak / MiB:.0f} MiB, "
                f"bound {self.rss_bound / MiB:.0f} MiB",
            }[name]
            if n:
                detail = f"{n} violations ({distinct} distinct); " + detail
            out.append((name, n == 0, detail))
        return out

    def _health_figures(self) -> str:
        lat = sorted(self.health_latencies)
        if not lat:
            return "none"
        p50 = lat[len(lat) // 2]
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms"

    @property
    def passed(self) -> bool:
        return (
            not self.fuzzer_errors
            and not self.stopped_early
            and all(ok is not False for _, ok, _ in self.invariant_results())
        )

    def render(self) -> str:
        lines = [
            f"wire fuzz: seed {self.seed}, {self.calls} calls in {self.duration_s:.1f}s "
            f"({self.calls / max(self.duration_s, 1e-9):.0f}/s)",
            "  calls by method: "
            + ", ".join(
                f"{k}={v} ({self.seconds_by_method.get(k, 0.0):.1f}s)"
                for k, v in self.by_method.most_common()
            ),
            "  outcomes by kind: " + ", ".join(f"{k}={v}" for k, v in self.by_kind.most_common()),
        ]
        if self.stopped_early:
            lines.append(f"  STOPPED EARLY: {self.stopped_early}")
        for err in self.fuzzer_errors:
            lines.append(f"  FUZZER ERROR: {err}")
        if self.violations:
            lines.append(
                f"Violations ({sum(self.violation_counts.values())} in all, "
                f"{len(self.violations)} distinct shown"
                + (
                    f", {self.dropped_violations} more distinct not kept"
                    if self.dropped_violations
                    else ""
                )
                + "):"
            )
            for v in sorted(self.violations.values(), key=lambda v: (v.invariant, v.at_s)):
                lines.append(v.render())
        lines.append("Invariants:")
        for name, ok, detail in self.invariant_results():
            mark = "SKIP" if ok is None else ("PASS" if ok else "MISS")
            lines.append(f"  {mark}  {name}: {detail}")
        return "\n".join(lines)
