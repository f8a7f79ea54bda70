"""``run_fuzz``: one fuzz run (bystander, workers, monitor, final checks) and its progress line."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from loadtest.wire_fuzz.bystander import Bystander
from loadtest.wire_fuzz.monitor import Monitor
from loadtest.wire_fuzz.report import FuzzReport
from loadtest.wire_fuzz.settings import CALL_TIMEOUT_S, OPS, FuzzSettings, MiB
from loadtest.wire_fuzz.state import RunState
from loadtest.wire_fuzz.worker import FuzzWorker


def run_fuzz(
    address: str,
    *,
    settings: FuzzSettings | None = None,
    duration_s: float = 20.0,
    max_calls: int = 1_000_000,
    seed: int | None = None,
    workers: int = 3,
    server_pid: int | None = None,
    on_runaway: Callable[[], None] | None = None,
    progress_s: float = 5.0,
    log: Callable[[str], None] | None = print,
    ops: Sequence[str] = (),
    ordered_fraction: float = 0.5,
) -> FuzzReport:
    """Fuzz the sidecar at ``address`` for ``duration_s`` (or ``max_calls``); check invariants.

    ``server_pid`` enables the RSS check; ``on_runaway`` is called once if the
    server's RSS runs ``RUNAWAY_BYTES`` past the bound (kill a server you own).
    The server must run with ``settings.server_args()``. Blocks until the run
    is over; call it from one thread at a time per server.
    """
    settings = settings or FuzzSettings()
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    say = log or (lambda _line: None)
    say(f"wire fuzz: seed {seed}, {workers} workers, {duration_s:g}s, server {address}")
    bystander = Bystander(address)
    unknown = set(ops) - {name for name, _ in OPS}
    if unknown:
        raise ValueError(f"unknown ops {sorted(unknown)}; known: {[n for n, _ in OPS]}")
    chosen = [(name, w) for name, w in OPS if not ops or name in ops]
    run = RunState(
        address, settings, seed, 0.0, max_calls, server_pid, on_runaway, chosen, ordered_fraction
    )
    monitor = Monitor(run)
    r = run.report
    start_rss = monitor.sample_rss()
    if start_rss is not None:
        r.rss_checked = True
        r.rss_start = r.rss_peak = start_rss
        r.rss_bound = start_rss + settings.rss_allowance
    run.started = time.monotonic()
    run.deadline = run.started + duration_s
    threads = [FuzzWorker(run, i) for i in range(workers)]
    monitor.start()
    for t in threads:
        t.start()
    next_progress = run.started + progress_s
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
            if time.monotonic() >= next_progress:
                next_progress += progress_s
                say(progress(run, monitor))
            # a worker stuck in a call past its deadline (should not happen: every call has one)
            if time.monotonic() > run.deadline + 4 * CALL_TIMEOUT_S:
                run.fatal("workers did not finish within 4 call timeouts of the deadline")
                break
    finally:
        run.stop.set()
        monitor.done.set()
        monitor.join(5)
        r.duration_s = time.monotonic() - run.started
    # After the run: one more health check and RSS sample, then the bystander.
    channel = run.channel()
    try:
        monitor.tick(channel)
    finally:
        channel.close()
    if r.stopped_early:
        r.bystander_detail = f"not checked: the run stopped early ({r.stopped_early})"
    else:
        r.bystander_ok, r.bystander_detail = bystander.check()
    bystander.close()
    say(progress(run, monitor))
    return r


def progress(run: RunState, monitor: Monitor) -> str:
    """One line: calls so far, their rate, violations, RSS, the commonest outcomes."""
    r = run.report
    with run.lock:
        kinds = ", ".join(f"{k}={v}" for k, v in r.by_kind.most_common(8))
        nviol = sum(r.violation_counts.values())
        calls = r.calls
    rss = monitor.sample_rss()
    rss_text = (
        f"rss {rss / MiB:.0f} MiB (peak {r.rss_peak / MiB:.0f}, bound {r.rss_bound / MiB:.0f})"
        if rss is not None
        else "rss ?"
    )
    t = run.elapsed()
    return (
        f"[{t:6.1f}s] calls {calls} ({calls / max(t, 1e-9):.0f}/s), violations {nviol}, "
        f"{rss_text}; {kinds}"
    )
