"""The monitor thread: the server's health every ``MONITOR_INTERVAL_S`` and its RSS."""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil

from loadtest.wire_fuzz.calls import check_health
from loadtest.wire_fuzz.settings import (
    FATAL_HEALTH_FAILURES,
    MONITOR_INTERVAL_S,
    RSS_IN_FLIGHT_FACTOR,
    RSS_SLACK_BYTES,
    RUNAWAY_BYTES,
    MiB,
)
from loadtest.wire_fuzz.state import RunState


class Monitor(threading.Thread):
    """Checks health every MONITOR_INTERVAL_S and samples the server's RSS (``health``, ``rss``).

    The thread calls :meth:`tick` until ``done`` is set; ``run_fuzz`` calls
    it once more after the thread has been joined (never both at once).
    :meth:`sample_rss` may be called from any thread. It kills the server
    (``on_runaway``) at most once, when RSS runs ``RUNAWAY_BYTES`` past the bound.
    """

    def __init__(self, run: RunState) -> None:
        super().__init__(name="wire-fuzz-monitor", daemon=True)
        self.run_ = run
        self.proc = psutil.Process(run.server_pid) if run.server_pid else None
        self.done = threading.Event()
        self.killed = False

    def sample_rss(self) -> int | None:
        if self.proc is None:
            return None
        try:
            return int(self.proc.memory_info().rss)
        except psutil.Error:
            return None

    def run(self) -> None:
        channel = self.run_.channel()
        try:
            while not self.done.wait(MONITOR_INTERVAL_S):
                self.tick(channel)
        finally:
            channel.close()

    def tick(self, channel: Any) -> None:
        run = self.run_
        r = run.report
        rss = self.sample_rss()
        if self.proc is not None and rss is None:
            run.violate("health", "the server process is gone", "", context=run.context())
            run.fatal("the server process exited")
            return
        if rss is not None:
            with run.lock:
                r.rss_peak = max(r.rss_peak, rss)
            if rss > r.rss_bound:
                run.violate(
                    "rss",
                    f"server RSS {rss / MiB:.0f} MiB > bound {r.rss_bound / MiB:.0f} MiB "
                    f"(start {r.rss_start / MiB:.0f} + {RSS_IN_FLIGHT_FACTOR} x "
                    f"max_in_flight {run.settings.max_in_flight_bytes / MiB:.0f} + "
                    f"read cache {run.settings.read_cache_bytes / MiB:.0f} + "
                    f"{RSS_SLACK_BYTES / MiB:.0f})",
                    "see context",
                    context=run.context(),
                )
                if rss > r.rss_bound + RUNAWAY_BYTES:
                    run.fatal(f"server RSS ran away ({rss / MiB:.0f} MiB)")
                    if run.on_runaway is not None and not self.killed:
                        self.killed = True
                        run.on_runaway()
                    return
        t0 = time.monotonic()
        ok, detail = check_health(channel)
        took = time.monotonic() - t0
        with run.lock:
            r.health_checks += 1
            if ok:
                r.health_latencies.append(took)
        if ok:
            run.health_failures_in_row = 0
            return
        run.health_failures_in_row += 1
        run.violate("health", f"{detail} (monitor)", "see context", context=run.context())
        if run.health_failures_in_row >= FATAL_HEALTH_FAILURES:
            run.fatal(
                f"server unhealthy for {run.health_failures_in_row} checks in a row "
                f"({detail}): stalled"
            )
