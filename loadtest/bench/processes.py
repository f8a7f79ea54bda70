"""Writer processes: split writers over processes, run them, collect every result.

Processes are spawned (never forked: grpc and threads exist in the parent).
Called from the benchmark's main thread only.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from dataclasses import replace
from typing import Any

from loadtest.bench.config import BenchError
from loadtest.writer_proc import WAIT_TIMEOUT_S, WriterPlan, WriterResult, process_main


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` nearly equal whole parts (the first ones larger)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def plans(base: WriterPlan, writers: int, processes: int) -> list[WriterPlan]:
    """``base`` for each of up to ``processes`` processes, ``writers`` writers in all."""
    out = []
    first = 0
    for n in split(writers, min(processes, writers)):
        out.append(replace(base, first_writer=first, threads=n))
        first += n
    return out


def run_writers(plans: list[WriterPlan], timeout_s: float) -> list[WriterResult]:
    """Run one writer process per plan; every writer's result, or BenchError."""
    ctx = mp.get_context("spawn")  # no fork after grpc or threads exist
    writers = sum(p.threads for p in plans)
    ready = ctx.Barrier(writers + 1)
    origin = ctx.Value("d", 0.0)
    round_barrier = ctx.Barrier(writers) if plans[0].mode == "rounds" else None
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(
            target=process_main,
            args=(plan, ready, origin, round_barrier, results),
            name=f"bench-writers-{i}",
            daemon=True,
        )
        for i, plan in enumerate(plans)
    ]
    for p in procs:
        p.start()
    out: list[WriterResult] = []
    deadline = time.monotonic() + timeout_s
    try:
        try:
            ready.wait(WAIT_TIMEOUT_S)
            # far enough ahead that every writer has seen it before it comes
            origin.value = time.monotonic() + 0.2
        except threading.BrokenBarrierError:
            pass  # a writer failed during setup: its result says why
        while len(out) < writers:
            if time.monotonic() > deadline:
                raise BenchError(f"writers did not finish within {timeout_s:.0f}s")
            try:
                out.append(results.get(timeout=1.0))
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    try:  # a result may have arrived just before the exit
                        while True:
                            out.append(results.get(timeout=0.5))
                    except queue.Empty:
                        pass
                    if len(out) < writers:
                        codes = [p.exitcode for p in procs]
                        raise BenchError(
                            f"writer processes exited (codes {codes}) with "
                            f"{writers - len(out)} writer(s) unreported"
                        ) from None
    finally:
        for p in procs:
            p.join(30)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
        results.close()
    errors = [r.error for r in out if r.error]
    # the root cause first: the others mostly failed at a barrier it broke
    errors.sort(key=lambda e: "BrokenBarrierError" in e)
    if errors:
        raise BenchError(f"{len(errors)} writer(s) failed; first: {errors[0]}")
    return sorted(out, key=lambda r: r.writer)
