"""(a) ``ValueState`` add / get / update per millisecond, as Flink's ``ValueStateBenchmark``.

Each operation first sets the current key, then touches one ``ValueState``
(:mod:`dstl_client.state.api`, ``INT64``), as Flink's benchmark does:

* ``add``: a key never seen before, ``update(v)``;
* ``get``: a key with state, ``value()``;
* ``update``: a key with state, ``update(v)``.

Backends:

* ``single-key``: :class:`~dstl_client.bounded.SingleKeyBackend`; keys come in
  increasing order (sorted input), each ``start_key`` drops the previous
  key's state, so ``get`` finds no value (in sorted mode a key's state is
  built during its run; this is Flink's method for SINGLE_KEY too).
* ``keyed``: :class:`~dstl_client.state.backend.KeyedStateBackend` over a
  real :class:`~dstl_client.state.store.LocalKeyedStore` (SQLite in a temp
  dir) holding ``setup_keys`` keys committed (as after earlier batches);
  keys in random order; a fresh backend (cold cache) per measurement; the
  time includes the end of the batch: dirty rows written to the store's
  pending batch and committed.
* ``keyed+changelog``: the same with every change also encoded and handed to
  a changelog writer, as in a streaming task (a no-op writer here: no
  sidecar, the encoding and buffering are measured, not the network).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from dstl_client.bounded import SingleKeyBackend, as_keyed_backend
from dstl_client.client import ChangelogWriter
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.api import KeyedContext
from dstl_client.state.backend import ChangelogStateBackend, KeyedStateBackend
from dstl_client.state.serializers import INT64
from dstl_client.state.store import LocalKeyedStore
from loadtest.bounded_bench.config import OPS

MAX_P = 128
BACKENDS = ("keyed", "keyed+changelog", "single-key")


@dataclass(frozen=True, slots=True)
class MicroResult:
    """ops/ms per operation of one backend (median of the rounds). Frozen."""

    backend: str
    ops_per_ms: dict[str, float]
    rounds: dict[str, list[float]]


class NullWriter:
    """Takes changes like a :class:`~dstl_client.client.ChangelogWriter` and drops them."""

    def __init__(self) -> None:
        self.changes = 0
        self.bytes = 0

    def append_many(self, changes: Iterable[tuple[int, bytes]]) -> None:
        for _, data in changes:
            self.changes += 1
            self.bytes += len(data)


def _rate(n: int, seconds: float) -> float:
    return n / (seconds * 1000.0) if seconds > 0 else float("inf")


def bench_single_key(op: str, n: int) -> float:
    """ops/ms of one measurement on the single-key backend."""
    backend = SingleKeyBackend()
    ctx = KeyedContext(as_keyed_backend(backend))
    state = ctx.value_state("v", INT64)
    start_key = backend.start_key
    keys = range(n)  # increasing: sorted input
    t0 = time.perf_counter()
    if op == "get":
        for k in keys:
            start_key(k)
            state.value()
    else:  # add and update are the same here: every key starts empty
        for k in keys:
            start_key(k)
            state.update(k)
    backend.end_key()
    return _rate(n, time.perf_counter() - t0)


def setup_store(directory: Path, keys: int) -> LocalKeyedStore:
    """A store with ``keys`` keys' ``ValueState`` committed (keys ``0..keys-1``)."""
    store = LocalKeyedStore(directory, KeyGroupRange(0, MAX_P - 1))
    loader = KeyedStateBackend(store, MAX_P, target="main")
    ctx = KeyedContext(loader)
    state = ctx.value_state("v", INT64)
    for k in range(keys):
        ctx.set_current_key(k)
        state.update(k)
    loader.flush()
    store.commit()
    return store


def bench_keyed(
    store: LocalKeyedStore, op: str, n: int, setup_keys: int, changelog: bool, round_no: int
) -> float:
    """ops/ms of one measurement on the keyed backend (fresh backend, cold cache)."""
    backend: KeyedStateBackend
    if changelog:
        writer = cast(ChangelogWriter, NullWriter())
        backend = ChangelogStateBackend(store, MAX_P, writer)
    else:
        backend = KeyedStateBackend(store, MAX_P)
    ctx = KeyedContext(backend)
    state = ctx.value_state("v", INT64)
    set_key = ctx.set_current_key
    rng = random.Random(round_no)
    if op == "add":  # keys no earlier round used either
        first = setup_keys + (round_no + 1) * n
        keys: list[int] = list(range(first, first + n))
        rng.shuffle(keys)
    else:
        keys = [rng.randrange(setup_keys) for _ in range(n)]
    t0 = time.perf_counter()
    if op == "get":
        for k in keys:
            set_key(k)
            state.value()
    else:
        for k in keys:
            set_key(k)
            state.update(k)
        if isinstance(backend, ChangelogStateBackend):
            backend.flush_log()
        backend.flush()
        store.commit()
    seconds = time.perf_counter() - t0
    # forget the pending batch: every round starts from the same committed state
    store.set_meta(delta_version=round_no, delta_attempt="bench")
    store.drop_delta()
    return _rate(n, seconds)


def run_micro(
    work: Path,
    *,
    ops: int,
    setup_keys: int,
    rounds: int,
    log: Callable[[str], None] = print,
) -> list[MicroResult]:
    """Every backend and operation, ``rounds`` times each; medians."""
    results: list[MicroResult] = []
    per: dict[str, list[float]] = {op: [] for op in OPS}
    for op in OPS:
        per[op] = [bench_single_key(op, ops) for _ in range(rounds)]
    single = MicroResult("single-key", {op: statistics.median(v) for op, v in per.items()}, per)
    log(f"micro single-key: {_fmt(single.ops_per_ms)}")
    t0 = time.perf_counter()
    with setup_store(work / "micro-store", setup_keys) as store:
        log(f"micro: {setup_keys:,} keys set up in {time.perf_counter() - t0:.1f}s")
        for name, changelog in (("keyed", False), ("keyed+changelog", True)):
            per = {op: [] for op in OPS}
            for op in OPS:
                for r in range(rounds):
                    per[op].append(bench_keyed(store, op, ops, setup_keys, changelog, r))
            result = MicroResult(name, {op: statistics.median(v) for op, v in per.items()}, per)
            log(f"micro {name}: {_fmt(result.ops_per_ms)}")
            results.append(result)
    results.append(single)
    return results


def _fmt(values: dict[str, Any]) -> str:
    return ", ".join(f"{op} {values[op]:,.0f}/ms" for op in OPS)
