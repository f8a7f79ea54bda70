"""Micro-benchmark of the node-local store's bulk paths (``dstl_client.state.bulk``).

Run ``python -m loadtest.bench_store_bulk`` (``--help`` for the options). For
each state size (keys in the store's main version) and each number of keys
touched per batch, it runs a few batches the way a vectorized task does:
read the state of the touched keys (:func:`read_rows`, pending batch
applied), write their new values (:func:`write_rows`: 90 % upserts, 10 %
deletes; a fifth of the keys are new), commit, and merge the batch into the
main version as the next task does (:meth:`LocalKeyedStore.merge_delta`).

It prints keys per second of the read and of the write (medians over the
batches, wall clock), the merge time, the per-key path on the same keys
for reference (``get`` per key, ``write_delta`` of tuples), and PASS/MISS
against two goals:

* read and write each at least ``--goal-keys-per-s`` (500 k) keys/s at the
  largest touched count;
* the cost is proportional to the keys touched, not to the state: the
  microseconds per key at the largest state are within ``--flat-ratio``
  (2x) of those at the smallest.

Not part of ``make test``: it takes about a minute and its figures depend
on the machine.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa

from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.bulk import read_rows, write_rows
from dstl_client.state.changes import state_prefix
from dstl_client.state.store import LocalKeyedStore

MAX_P = 128
STATE = b"count"


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds of one step: wall clock and this process's CPU time."""

    wall: float
    cpu: float


@dataclass(frozen=True, slots=True)
class Case:
    """The medians of one (state size, keys touched) pair, per step."""

    state: int
    touched: int
    steps: dict[str, Timing]

    def rate(self, step: str, cpu: bool) -> str:
        t = self.steps.get(step)
        if t is None:
            return "-"
        return f"{self.touched / (t.cpu if cpu else t.wall) / 1e3:,.0f}"


#: the steps of a batch, and the reference steps on the same keys (last batch only)
STEPS = ("read", "write", "merge")
REFERENCE = ("get per key", "temp table read", "executemany write")


def _keys(ids: list[int]) -> pa.Table:
    """The row addresses of the ``count`` state of integer keys ``ids``."""
    kbs = [str(i).encode() for i in ids]
    return pa.table(
        {
            "kg": pa.array([zlib.crc32(b) % MAX_P for b in kbs], pa.int32()),
            "k": pa.array([state_prefix(STATE, b) for b in kbs], pa.binary()),
        }
    )


def _values(ids: list[int], batch: int) -> pa.Array:
    """New values of a batch: one key in ten deleted."""
    return pa.array(
        [None if i % 10 == batch % 10 else (i + batch).to_bytes(8, "little") for i in ids],
        pa.binary(),
    )


def _load(store: LocalKeyedStore, size: int) -> None:
    """A main version of ``size`` keys (written with the bulk path, merged)."""
    step = 200_000
    for start in range(0, size, step):
        ids = list(range(start, min(size, start + step)))
        values = pa.array([i.to_bytes(8, "little") for i in ids], pa.binary())
        write_rows(store, _keys(ids).append_column("v", values))
    store.set_meta(delta_version=0, delta_attempt="load")
    store.commit()
    store.merge_delta()


def _touched(rnd: random.Random, state: int, touched: int) -> list[int]:
    """Keys of one batch: four fifths stored (as many as there are), the rest new."""
    old = min(state, touched * 4 // 5)
    new = rnd.sample(range(state, state + 4 * touched), touched - old)
    return rnd.sample(range(state), old) + new


def _timed(fn: Callable[[], object]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


def _get_each(store: LocalKeyedStore, pairs: list[tuple[int, bytes]]) -> list[bytes | None]:
    return [store.get(kg, k, True) for kg, k in pairs]


def _temp_table_read(store: LocalKeyedStore, pairs: list[tuple[int, bytes]]) -> list[bytes | None]:
    """The alternative measured against the packed read: executemany into a table, one join."""
    db = store._db
    db.execute("CREATE TEMP TABLE IF NOT EXISTS bench_keys (kg INTEGER, k BLOB)")
    db.execute("DELETE FROM temp.bench_keys")
    db.executemany("INSERT INTO temp.bench_keys (kg, k) VALUES (?, ?)", pairs)
    sql = (
        "SELECT CASE WHEN d.k IS NULL THEN (SELECT v FROM kv WHERE kv.kg = q.kg AND kv.k = q.k) "
        "ELSE d.v END FROM temp.bench_keys q LEFT JOIN delta d ON d.kg = q.kg AND d.k = q.k "
        "ORDER BY q.rowid"
    )
    return [row[0] for row in db.execute(sql)]


def run_case(root: Path, state: int, touched: int, batches: int, reference: bool) -> Case:
    directory = Path(tempfile.mkdtemp(dir=root))
    times: dict[str, list[Timing]] = {step: [] for step in STEPS + REFERENCE}
    try:
        with LocalKeyedStore(directory, KeyGroupRange(0, MAX_P - 1)) as store:
            _load(store, state)
            rnd = random.Random(state * 31 + touched)
            for batch in range(1, batches + 1):
                ids = _touched(rnd, state, touched)
                keys = _keys(ids)
                rows = keys.append_column("v", _values(ids, batch))
                times["read"].append(_timed(partial(read_rows, store, keys)))
                times["write"].append(_timed(partial(write_rows, store, rows)))
                store.set_meta(delta_version=batch, delta_attempt="a")
                store.commit()
                if reference and batch == batches:
                    _reference(store, keys, rows, times)
                times["merge"].append(_timed(store.merge_delta))
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    def median(ts: list[Timing]) -> Timing:
        return Timing(statistics.median(t.wall for t in ts), statistics.median(t.cpu for t in ts))

    return Case(state, touched, {step: median(ts) for step, ts in times.items() if ts})


def _reference(
    store: LocalKeyedStore, keys: pa.Table, rows: pa.Table, times: dict[str, list[Timing]]
) -> None:
    """The per-key and executemany paths on the same keys (the delta is written again)."""
    kgs, ks = keys.column("kg").to_pylist(), keys.column("k").to_pylist()
    pairs = list(zip(kgs, ks, strict=True))
    triples = list(zip(kgs, ks, rows.column("v").to_pylist(), strict=True))
    store.begin()  # as the task's reads and writes are
    expected = read_rows(store, keys).column("v").to_pylist()
    got = _temp_table_read(store, pairs)
    times["get per key"].append(_timed(partial(_get_each, store, pairs)))
    times["temp table read"].append(_timed(partial(_temp_table_read, store, pairs)))
    times["executemany write"].append(_timed(partial(store.write_delta, triples)))
    store.commit()
    if got != expected:  # pragma: no cover - a broken alternative is no reference
        raise AssertionError("the temp-table read disagrees with the bulk read")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", default="10000,100000,1000000", help="state sizes (keys)")
    parser.add_argument("--touched", default="20000,100000", help="keys touched per batch")
    parser.add_argument("--batches", type=int, default=5, help="batches per case")
    parser.add_argument("--goal-keys-per-s", type=float, default=500_000)
    parser.add_argument("--flat-ratio", type=float, default=2.0)
    parser.add_argument(
        "--no-reference", action="store_true", help="skip the per-key and executemany paths"
    )
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = parser.parse_args(argv)
    states = [int(s) for s in args.states.split(",")]
    touched = [int(t) for t in args.touched.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench-store-bulk-", dir=args.dir))
    cases: list[Case] = []
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; k keys/s, CPU time")
    print("(wall clock in brackets); merge: the next batch's merge of this batch's delta")
    names = STEPS + (() if args.no_reference else REFERENCE)
    print(f"{'state':>9} {'touched':>8} " + " ".join(f"{n:>19}" for n in names))
    try:
        for t in touched:
            for s in states:
                case = run_case(root, s, t, args.batches, reference=not args.no_reference)
                cases.append(case)
                cells = [f"{case.rate(n, True)} ({case.rate(n, False)})" for n in names]
                print(f"{s:>9,} {t:>8,} " + " ".join(f"{c:>19}" for c in cells), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if _verdicts(cases, max(touched), args.goal_keys_per_s, args.flat_ratio) else 1


def _verdicts(cases: list[Case], top: int, goal: float, flat: float) -> bool:
    """PASS/MISS lines (CPU time: the machine may be shared); True when all pass."""
    ok = True

    def say(passed: bool, line: str) -> None:
        nonlocal ok
        ok = ok and passed
        print(f"{'PASS' if passed else 'MISS'}: {line}")

    print()
    for case in (c for c in cases if c.touched == top):
        for step in ("read", "write"):
            rate = case.touched / case.steps[step].cpu
            say(
                rate >= goal,
                f"{step} {rate / 1e3:,.0f} k keys/s at {case.touched:,} touched, "
                f"{case.state:,}-key state (goal >= {goal / 1e3:,.0f} k)",
            )
    for t in sorted({c.touched for c in cases}):
        row = sorted((c for c in cases if c.touched == t), key=lambda c: c.state)
        first, last = row[0], row[-1]
        if first is last:
            continue
        for what, steps in (("read", ("read",)), ("write + merge", ("write", "merge"))):
            us_a = sum(first.steps[s].cpu for s in steps) / t * 1e6
            us_b = sum(last.steps[s].cpu for s in steps) / t * 1e6
            say(
                us_b <= flat * us_a,
                f"{what} per key, {t:,} touched: {us_a:.2f} us at {first.state:,} keys, "
                f"{us_b:.2f} us at {last.state:,} ({us_b / us_a:.2f}x, goal <= {flat:g}x)",
            )
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
