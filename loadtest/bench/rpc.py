"""The rpc phase: what one trivial writer call costs (the floor under every call)."""

from __future__ import annotations

import time
from typing import Any

from dstl_client import ChangelogClient
from loadtest.bench.measure import say
from loadtest.bench.target import BenchTarget


def rpc_phase(t: BenchTarget, calls: int) -> dict[str, Any]:
    """Cost of one trivial call (LastAppendedSqn), sequential, one client, the run's transport.

    The floor under every append and persist: with N writers persisting
    together the server spends at least N times this on the calls alone.
    """
    with ChangelogClient(t.server.address, transport=t.cfg.transport) as client:
        client.wait_ready(30)
        with client.create_writer(
            job_id="bench-rpc", operator_id="rpc", key_group_range=(0, 0)
        ) as w:
            for _ in range(max(10, calls // 10)):  # warm-up
                w.last_appended_sqn()
            cpu0, t0 = t.cpu_s(), time.perf_counter()
            for _ in range(calls):
                w.last_appended_sqn()
            wall, cpu_s = time.perf_counter() - t0, t.cpu_s() - cpu0
    out = {
        "calls": calls,
        "transport": t.cfg.transport,
        "wall_us_per_call": round(wall / calls * 1e6, 1),
        "server_cpu_us_per_call": round(cpu_s / calls * 1e6, 1),
    }
    say(
        f"[rpc] one {t.cfg.transport} call: {out['wall_us_per_call']:.0f} us round trip, "
        f"{out['server_cpu_us_per_call']:.0f} us of server CPU"
    )
    return out
