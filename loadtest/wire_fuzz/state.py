"""The state one fuzz run shares between its worker threads and its monitor thread."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import psutil

from dstl_client.core._pb import dstl_pb2 as pb
from loadtest.wire_fuzz.report import FuzzReport, Violation, signature
from loadtest.wire_fuzz.settings import MAX_DISTINCT_VIOLATIONS, OPS, FuzzSettings

#: handles kept for ReadChanges, DiscardObjects and ListObjects (a random one is replaced)
MAX_HANDLES = 64


class RunState:
    """State shared by the workers and the monitor of one fuzz run.

    Invariants: ``report``, ``handles``, ``in_flight`` and ``recent`` are read
    and written only under ``lock`` (every thread of the run does);
    ``report.calls`` never exceeds ``max_calls``; ``stop`` once set stays
    set. ``health_failures_in_row`` belongs to the monitor thread alone.
    ``started`` and ``deadline`` are set by ``run_fuzz`` before any thread starts.
    """

    def __init__(
        self,
        address: str,
        settings: FuzzSettings,
        seed: int,
        deadline: float,
        max_calls: int,
        server_pid: int | None,
        on_runaway: Callable[[], None] | None,
        ops: Sequence[tuple[str, int]] = (),
        ordered_fraction: float = 0.5,
    ) -> None:
        self.ops = list(ops or OPS)
        self.ordered_fraction = ordered_fraction
        self.address = address
        self.settings = settings
        self.seed = seed
        self.started = time.monotonic()
        self.deadline = deadline
        self.max_calls = max_calls
        self.server_pid = server_pid
        self.on_runaway = on_runaway
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.report = FuzzReport(seed, settings)
        self.handles: list[tuple[str, pb.Handle]] = []
        self.in_flight: dict[int, tuple[str, float]] = {}
        self.recent: dict[int, deque[str]] = {}
        self.health_failures_in_row = 0

    def channel(self) -> Any:
        """A new channel to the server (one per thread; the caller closes it)."""
        return grpc.insecure_channel(
            self.address,
            options=[
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1),
                ("grpc.enable_retries", 0),
            ],
        )

    def server_alive(self) -> bool:
        """False once the server process (when its pid is known) has exited."""
        if not self.server_pid:
            return True
        try:
            return bool(psutil.Process(self.server_pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def take_call_number(self) -> int | None:
        """The number of the next call, or None once ``max_calls`` were taken."""
        with self.lock:
            if self.report.calls >= self.max_calls:
                return None
            self.report.calls += 1
            return self.report.calls

    def context(self) -> list[str]:
        """What every worker is sending right now and sent just before."""
        now = time.monotonic()
        out: list[str] = []
        with self.lock:
            flying = sorted(self.in_flight.items(), key=lambda item: item[1][1])
            for i, (w, (desc, t0)) in enumerate(flying):
                label = "in flight (longest)" if i == 0 else "in flight"
                out.append(f"{label} on worker {w} for {now - t0:.1f}s: {desc}")
            for w, recent in sorted(self.recent.items()):
                out += [f"worker {w} sent before: {d}" for d in list(recent)[-2:]]
        return out

    def violate(
        self,
        invariant: str,
        what: str,
        request: str,
        worker: int = -1,
        call_no: int = 0,
        context: list[str] | None = None,
        method: str = "",
    ) -> None:
        """Count a violation; keep it as an example if its kind is new (and room is left)."""
        sig = signature(invariant, method, what)
        with self.lock:
            r = self.report
            r.violation_counts[invariant] += 1
            v = r.violations.get(sig)
            if v is not None:
                v.count += 1
                return
            if len(r.violations) >= MAX_DISTINCT_VIOLATIONS:
                r.dropped_violations += 1
                return
            r.violations[sig] = Violation(
                invariant,
                what,
                request,
                self.seed,
                worker,
                call_no,
                self.elapsed(),
                context or [],
            )

    def fatal(self, why: str) -> None:
        """Stop the run early (the first reason is kept)."""
        with self.lock:
            if not self.report.stopped_early:
                self.report.stopped_early = why
        self.stop.set()

    def add_handle(self, job: str, handle: pb.Handle, rng: random.Random) -> None:
        with self.lock:
            if len(self.handles) < MAX_HANDLES:
                self.handles.append((job, handle))
            else:
                self.handles[rng.randrange(MAX_HANDLES)] = (job, handle)

    def snapshot_handles(self) -> list[tuple[str, pb.Handle]]:
        with self.lock:
            return list(self.handles)
