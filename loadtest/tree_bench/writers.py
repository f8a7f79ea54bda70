"""Writer processes (one per node) of threads: every interval each appends its changes, then ``persist_durably``.

All writers tick on the same schedule (round r starts at ``start + r * interval``),
as a job's subtasks checkpoint together; a round whose persist ran late starts late.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from dstl_client import ChangelogClient, ChangelogHandle
from loadtest.tree_bench.config import BenchConfig

JOB = "tree-bench"
KEY_GROUPS = 128
START_TIMEOUT_S = 60.0


@dataclass(slots=True)
class Persisted:
    """One acknowledged persist: its round, latency and handle; ``want`` only when sampled."""

    round: int
    latency_us: int
    handle: ChangelogHandle
    nbytes: int
    want: list[tuple[int, bytes]] | None = None


@dataclass(slots=True)
class WriterRun:
    """What one writer did; written by its thread only, read after it ended."""

    node: int
    index: int
    persisted: list[Persisted] = field(default_factory=list)
    error: str | None = None


def _changes(
    rng: random.Random, pool: bytes, tag: str, n: int, size: int
) -> list[tuple[int, bytes]]:
    out = []
    for i in range(n):
        head = f"{tag}.{i}|".encode()
        off = rng.randrange(len(pool) - size)
        out.append((rng.randrange(KEY_GROUPS), (head + pool[off : off + size])[:size]))
    return out


def writer_loop(
    client: ChangelogClient, cfg: BenchConfig, run: WriterRun, start: float, stop: threading.Event
) -> None:
    """Writer ``run.index`` of node ``run.node``: ``cfg.rounds`` checkpoints from ``start``."""
    rng = random.Random(cfg.seed * 1_000_003 + run.node * 1000 + run.index)
    pool = rng.randbytes(64 * 1024)
    w = client.create_writer(
        job_id=JOB, operator_id=f"n{run.node}-w{run.index}", key_group_range=(0, KEY_GROUPS - 1)
    )
    try:
        after = 0
        deadline = start + cfg.rounds * cfg.interval_s + 2 * cfg.persist_timeout_s
        for r in range(cfg.rounds):
            if stop.is_set() or time.monotonic() > deadline:
                break
            time.sleep(max(0.0, start + r * cfg.interval_s - time.monotonic()))
            tag = f"n{run.node}.w{run.index}.r{r}"
            changes = _changes(rng, pool, tag, cfg.changes_per_checkpoint, cfg.change_bytes)
            w.append_many(changes)
            w.flush()  # the append RPC is not part of the persist latency
            t0 = time.perf_counter()
            handle = w.persist_durably(after=after).result(timeout=cfg.persist_timeout_s)
            us = max(1, int((time.perf_counter() - t0) * 1e6))
            after = handle.to_sqn
            keep = r == cfg.warmup_rounds or rng.random() < cfg.verify_fraction
            run.persisted.append(
                Persisted(r, us, handle, sum(len(d) for _, d in changes), changes if keep else None)
            )
    finally:
        w.close()


def node_main(
    address: str, cfg: BenchConfig, node: int, hold: bool, go: Any, start_at: Any, out: Any
) -> None:
    """One node's writer process (a job's executor): one client, one thread per writer.

    Puts ``("ready", node, None)`` once its writers can start, waits for ``go``,
    then puts ``("done", node, [WriterRun, ...])`` (or ``("error", node, text)``).
    """
    try:
        with ChangelogClient(address) as client:
            client.wait_ready(10)
            idle = None
            if hold:
                idle = client.create_writer(
                    job_id=JOB, operator_id="idle", key_group_range=(0, KEY_GROUPS - 1)
                )
            runs = [WriterRun(node, i) for i in range(cfg.writers)]
            stop = threading.Event()

            def body(run: WriterRun) -> None:
                try:
                    writer_loop(client, cfg, run, start_at.value, stop)
                except BaseException as exc:
                    run.error = f"node {run.node} writer {run.index}: {exc!r}\n" + (
                        traceback.format_exc(limit=4)
                    )
                    stop.set()

            out.put(("ready", node, None))
            if not go.wait(START_TIMEOUT_S):
                raise RuntimeError("no go signal")
            threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in runs]
            for t in threads:
                t.start()
            limit = start_at.value + cfg.rounds * cfg.interval_s + 3 * cfg.persist_timeout_s
            for t in threads:
                t.join(max(0.1, limit - time.monotonic()))
            stop.set()
            for r, t in zip(runs, threads, strict=True):
                if t.is_alive() and r.error is None:
                    r.error = f"node {node} writer {r.index}: did not finish in time"
            if idle is not None:
                idle.close()
            out.put(("done", node, runs))
    except BaseException as exc:
        out.put(("error", node, f"node {node}: {exc!r}\n{traceback.format_exc(limit=4)}"))


class WriterProcesses:
    """One writer process per node (spawned); ``pids`` once started, ``run()`` the rounds.

    Leaving the ``with`` block joins every process, killing those still alive.
    """

    def __init__(self, addresses: list[str], cfg: BenchConfig, hold: list[bool]) -> None:
        ctx = mp.get_context("spawn")
        self.cfg = cfg
        self.queue: Any = ctx.Queue()
        self.go = ctx.Event()
        self.start_at = ctx.Value("d", 0.0)
        self.procs = [
            ctx.Process(
                target=node_main,
                args=(a, cfg, i, h, self.go, self.start_at, self.queue),
                daemon=True,
                name=f"tree-bench-node-{i}",
            )
            for i, (a, h) in enumerate(zip(addresses, hold, strict=True))
        ]

    def __enter__(self) -> WriterProcesses:
        try:
            for p in self.procs:
                p.start()
            ready = 0
            deadline = time.monotonic() + START_TIMEOUT_S
            while ready < len(self.procs):
                kind, _node, payload = self.queue.get(timeout=max(0.1, deadline - time.monotonic()))
                if kind == "error":
                    raise RuntimeError(payload)
                ready += kind == "ready"
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def pids(self) -> dict[str, int]:
        return {f"writers-{i}": p.pid for i, p in enumerate(self.procs) if p.pid is not None}

    def run(self, start: float) -> list[WriterRun]:
        """Start every writer at ``start`` (monotonic); every node's runs once all ended."""
        self.start_at.value = start
        self.go.set()
        runs: list[WriterRun] = []
        done = 0
        deadline = start + self.cfg.rounds * self.cfg.interval_s + 4 * self.cfg.persist_timeout_s
        while done < len(self.procs):
            kind, _node, payload = self.queue.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind == "error":
                raise RuntimeError(payload)
            runs.extend(payload)
            done += 1
        return runs

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
