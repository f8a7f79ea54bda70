"""Writer processes of the benchmark: each runs several writers on threads.

A process opens one :class:`~dstl_client.ChangelogClient` (as a PySpark
Python worker would) and runs ``plan.threads`` writers on it, each on its own
thread. Two modes:

* ``stream``: append batches of pre-built changes as fast as possible for
  ``duration_s``, checkpointing (``persist_durably``) every
  ``checkpoint_interval_s`` and truncating every ``materialize_every``
  checkpoints; a last persist at the end makes every counted byte durable.
* ``rounds``: ``rounds`` checkpoints in lockstep with every other writer of
  the run, like a checkpoint coordinator's periodic trigger: append
  ``round_bytes``, send them, wait at a barrier shared by all processes, sleep
  until the round's start time (``origin + r * round_interval_s``, the same
  clock instant for every writer), then time ``persist_durably`` alone. The
  next round's appends wait at the barrier until every writer's persist
  returned, as a Spark micro-batch starts after the previous one committed:
  no writer's next batch competes with another's persist (for the CPU, or
  for the GIL of the writers sharing a process).

Start: every writer waits at the ``ready`` barrier (the parent takes part),
then until the parent has published the common start time in ``origin``.

Every writer puts one :class:`WriterResult` on the results queue, also when
it fails (with ``error`` set); a failing writer aborts the barriers so that
no other writer waits for it forever.
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Literal

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter

#: bound on every wait of a writer: a stuck server fails the run, never hangs it
WAIT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class WriterPlan:
    """What one writer process does (picklable; sent to spawned processes)."""

    target: str
    job_id: str
    mode: Literal["stream", "rounds"]
    first_writer: int
    threads: int
    change_bytes: int
    batch_bytes: int
    duration_s: float = 0.0
    checkpoint_interval_s: float = 1.0
    rounds: int = 0
    round_bytes: int = 0
    round_interval_s: float = 0.1
    warmup_rounds: int = 0
    materialize_every: int = 5
    key_groups_per_writer: int = 128
    #: rounds mode: leave the round's appends buffered so they travel inside the
    #: persist call (the real checkpoint path) instead of flushing them first
    appends_with_persist: bool = False
    #: the client's transport for writer calls: "stream" (the default) or "unary"
    transport: str = "stream"


@dataclass(slots=True)
class WriterResult:
    """What one writer did; times are ``time.monotonic()`` (system-wide on Linux)."""

    writer: int
    changes: int = 0
    payload_bytes: int = 0
    started: float = 0.0
    finished: float = 0.0
    persists: int = 0
    #: latency of every timed persist, in microseconds (rounds mode: after warm-up)
    persist_latencies_us: list[int] = field(default_factory=list)
    #: rounds mode: per round, the object holding that round's changes
    round_objects: list[str] = field(default_factory=list)
    #: rounds mode: per round, when persist_durably was called (time.monotonic())
    round_calls: list[float] = field(default_factory=list)
    #: CPU seconds of the whole writer process from the start time on (set on
    #: the process's first writer only, 0 on the others)
    process_cpu_s: float = 0.0
    error: str | None = None


def _changes(plan: WriterPlan, writer: int, count: int) -> list[tuple[int, bytes]]:
    """``count`` changes of ``change_bytes`` spread over the writer's key groups."""
    rng = random.Random(writer)
    first = writer * plan.key_groups_per_writer
    pool = [os.urandom(plan.change_bytes) for _ in range(64)]
    return [
        (first + rng.randrange(plan.key_groups_per_writer), pool[i % len(pool)])
        for i in range(count)
    ]


def _persist(w: ChangelogWriter, after: int) -> tuple[ChangelogHandle, int]:
    t0 = time.perf_counter()
    handle = w.persist_durably(after=after).result(timeout=WAIT_TIMEOUT_S)
    return handle, int((time.perf_counter() - t0) * 1e6)


def _wait_start(ready: Any, origin: Any) -> float:
    """Pass the ready barrier, then sleep until the start time the parent publishes."""
    ready.wait(WAIT_TIMEOUT_S)
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while origin.value <= 0:
        if time.monotonic() > deadline:
            raise TimeoutError("no start time published")
        time.sleep(0.001)
    start = float(origin.value)
    time.sleep(max(0.0, start - time.monotonic()))
    return start


def _stream(
    plan: WriterPlan, w: ChangelogWriter, res: WriterResult, ready: Any, origin: Any
) -> None:
    # a call to append_many of about a quarter of a client batch: the loop
    # checks the clock often enough and the client still sends full batches
    per_call = max(1, plan.batch_bytes // 4 // (plan.change_bytes + 4))
    batch = _changes(plan, res.writer, per_call)
    batch_payload = per_call * plan.change_bytes
    _wait_start(ready, origin)
    res.started = time.monotonic()
    deadline = res.started + plan.duration_s
    next_checkpoint = res.started + plan.checkpoint_interval_s
    materialized = 0
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        w.append_many(batch)
        res.changes += per_call
        res.payload_bytes += batch_payload
        if now >= next_checkpoint:
            handle, us = _persist(w, materialized)
            res.persist_latencies_us.append(us)
            res.persists += 1
            if res.persists % plan.materialize_every == 0:
                w.truncate(before=handle.to_sqn)
                materialized = handle.to_sqn
            next_checkpoint = time.monotonic() + plan.checkpoint_interval_s
    _persist(w, materialized)  # everything counted is now durable
    res.finished = time.monotonic()


def _rounds(
    plan: WriterPlan,
    w: ChangelogWriter,
    res: WriterResult,
    ready: Any,
    origin: Any,
    round_barrier: Any,
) -> None:
    per_round = max(1, plan.round_bytes // plan.change_bytes)
    batch = _changes(plan, res.writer, per_round)
    start = _wait_start(ready, origin)
    res.started = time.monotonic()
    materialized = 0
    for r in range(plan.rounds):
        if r:  # the round's appends start once every writer's last persist returned
            round_barrier.wait(WAIT_TIMEOUT_S)
        w.append_many(batch)
        if not plan.appends_with_persist:
            w.flush()  # appends travel before the barrier: the timer sees the persist only
        res.changes += per_round
        res.payload_bytes += per_round * plan.change_bytes
        round_barrier.wait(WAIT_TIMEOUT_S)
        time.sleep(max(0.0, start + r * plan.round_interval_s - time.monotonic()))
        res.round_calls.append(time.monotonic())
        handle, us = _persist(w, materialized)
        res.persists += 1
        if r >= plan.warmup_rounds:
            res.persist_latencies_us.append(us)
        res.round_objects.append(handle.entries[-1].object_key if handle.entries else "")
        if res.persists % plan.materialize_every == 0:
            w.truncate(before=handle.to_sqn)
            materialized = handle.to_sqn
    res.finished = time.monotonic()


def _writer_thread(
    plan: WriterPlan,
    client: ChangelogClient,
    index: int,
    sync: tuple[Any, Any, Any],
    results: list[WriterResult],
) -> None:
    ready, origin, round_barrier = sync
    res = WriterResult(writer=index)
    try:
        first = index * plan.key_groups_per_writer
        with client.create_writer(
            job_id=plan.job_id,
            operator_id=f"bench-op-{index}",
            key_group_range=(first, first + plan.key_groups_per_writer - 1),
        ) as w:
            if plan.mode == "stream":
                _stream(plan, w, res, ready, origin)
            else:
                _rounds(plan, w, res, ready, origin, round_barrier)
    except BaseException as exc:
        res.error = f"writer {index}: {exc!r}\n{traceback.format_exc(limit=5)}"
        # let every other writer fail fast instead of waiting at a barrier
        for b in (ready, round_barrier):
            if b is not None:
                b.abort()
    results.append(res)


def process_main(
    plan: WriterPlan, ready: Any, origin: Any, round_barrier: Any, results: Any
) -> None:
    """Entry point of one writer process: ``plan.threads`` writers on one client.

    ``ready`` is a barrier of every writer plus the parent; ``origin`` a shared
    double the parent sets to the common start time (``time.monotonic()``)
    once everyone is ready; ``round_barrier`` (rounds mode) a barrier of every
    writer; ``results`` the queue for :class:`WriterResult` (every writer's
    result is put there once all writers of the process are done).
    """
    done: list[WriterResult] = []  # list.append is atomic: the writer threads share it
    with ChangelogClient(
        plan.target, batch_bytes=plan.batch_bytes, transport=plan.transport
    ) as client:
        try:
            client.wait_ready(30)
        except Exception as exc:
            for i in range(plan.threads):
                results.put(WriterResult(plan.first_writer + i, error=repr(exc)))
            ready.abort()
            return
        threads = [
            threading.Thread(
                target=_writer_thread,
                args=(
                    plan,
                    client,
                    plan.first_writer + i,
                    (ready, origin, round_barrier),
                    done,
                ),
                name=f"writer-{plan.first_writer + i}",
                daemon=True,
            )
            for i in range(plan.threads)
        ]
        for t in threads:
            t.start()
        cpu0 = time.process_time()
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while (
            origin.value <= 0 and time.monotonic() < deadline and any(t.is_alive() for t in threads)
        ):
            time.sleep(0.001)
        if origin.value > 0:
            time.sleep(max(0.0, origin.value - time.monotonic()))
            cpu0 = time.process_time()
        for t in threads:
            t.join()
        cpu = time.process_time() - cpu0
    done.sort(key=lambda r: r.writer)
    if done:
        done[0].process_cpu_s = cpu
    for res in done:
        results.put(res)
