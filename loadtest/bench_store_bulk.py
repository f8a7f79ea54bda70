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
class Case:
    """The medians of one (state size, keys touched) pair."""

    state: int
    touched: int
    read_s: float
    write_s: float
    merge_s: float
    per_key_read_s: float | None
    per_key_write_s: float | None

    def rate(self, seconds: float | None) -> str:
        return "-" if seconds is None else f"{self.touched / seconds / 1e3:,.0f} k/s"


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
    return pa.array(
        [None if i % 10 == batch % 10 else (i + batch).to_bytes(8, "little") for i in ids],
        pa.binary(),
    )


def _load(store: LocalKeyedStore, size: int) -> None:
    """A main version of ``size`` keys (written with the bulk path, merged)."""
    step = 200_000
    for start in range(0, size, step):
        ids = list(range(start, min(size, start + step)))
        keys = _keys(ids)
        values = pa.array([i.to_bytes(8, "little") for i in ids], pa.binary())
        write_rows(store, keys.append_column("v", values))
    store.set_meta(delta_version=0, delta_attempt="load")
    store.commit()
    store.merge_delta()


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _get_each(store: LocalKeyedStore, pairs: list[tuple[int, bytes]]) -> list[bytes | None]:
    return [store.get(kg, k, True) for kg, k in pairs]


def run_case(root: Path, state: int, touched: int, batches: int, per_key: bool) -> Case:
    directory = Path(tempfile.mkdtemp(dir=root))
    try:
        with LocalKeyedStore(directory, KeyGroupRange(0, MAX_P - 1)) as store:
            _load(store, state)
            rnd = random.Random(state * 31 + touched)
            reads, writes, merges = [], [], []
            pk_reads, pk_writes = [], []
            for batch in range(1, batches + 1):
                # four fifths stored keys, one fifth new ones
                ids = rnd.sample(range(state + state // 4 + touched), touched)
                keys = _keys(ids)
                rows = keys.append_column("v", _values(ids, batch))
                reads.append(_timed(partial(read_rows, store, keys)))
                writes.append(_timed(partial(write_rows, store, rows)))
                store.set_meta(delta_version=batch, delta_attempt="a")
                store.commit()
                if per_key and batch == batches:
                    pairs = list(
                        zip(
                            keys.column("kg").to_pylist(), keys.column("k").to_pylist(), strict=True
                        )
                    )
                    triples = [
                        (kg, k, v)
                        for (kg, k), v in zip(pairs, rows.column("v").to_pylist(), strict=True)
                    ]
                    pk_reads.append(_timed(partial(_get_each, store, pairs)))
                    pk_writes.append(_timed(partial(store.write_delta, triples)))
                    store.commit()
                merges.append(_timed(store.merge_delta))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    med = statistics.median
    return Case(
        state,
        touched,
        med(reads),
        med(writes),
        med(merges),
        med(pk_reads) if pk_reads else None,
        med(pk_writes) if pk_writes else None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", default="10000,100000,1000000", help="state sizes (keys)")
    parser.add_argument("--touched", default="20000,100000", help="keys touched per batch")
    parser.add_argument("--batches", type=int, default=5, help="batches per case")
    parser.add_argument("--goal-keys-per-s", type=float, default=500_000)
    parser.add_argument("--flat-ratio", type=float, default=2.0)
    parser.add_argument("--no-per-key", action="store_true", help="skip the per-key reference")
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = parser.parse_args(argv)
    states = [int(s) for s in args.states.split(",")]
    touched = [int(t) for t in args.touched.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench-store-bulk-", dir=args.dir))
    cases: list[Case] = []
    try:
        print(
            f"{'state':>9} {'touched':>8} {'read':>12} {'write':>12} {'merge':>9} "
            f"{'per-key get':>12} {'per-key write':>14}"
        )
        for t in touched:
            for s in states:
                case = run_case(root, s, t, args.batches, per_key=not args.no_per_key)
                cases.append(case)
                print(
                    f"{s:>9,} {t:>8,} {case.rate(case.read_s):>12} {case.rate(case.write_s):>12} "
                    f"{case.merge_s * 1e3:>7.0f}ms {case.rate(case.per_key_read_s):>12} "
                    f"{case.rate(case.per_key_write_s):>14}",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if _verdicts(cases, max(touched), args.goal_keys_per_s, args.flat_ratio) else 1


def _verdicts(cases: list[Case], top: int, goal: float, flat: float) -> bool:
    ok = True

    def say(passed: bool, line: str) -> None:
        nonlocal ok
        ok = ok and passed
        print(f"{'PASS' if passed else 'MISS'}: {line}")

    print()
    for case in (c for c in cases if c.touched == top):
        for what, seconds in (("read", case.read_s), ("write", case.write_s)):
            rate = case.touched / seconds
            say(
                rate >= goal,
                f"{what} {rate / 1e3:,.0f} k keys/s at {case.touched:,} touched, "
                f"{case.state:,}-key state (goal >= {goal / 1e3:,.0f} k)",
            )
    for t in sorted({c.touched for c in cases}):
        row = sorted((c for c in cases if c.touched == t), key=lambda c: c.state)
        first, last = row[0], row[-1]
        for what, a, b in (
            ("read", first.read_s, last.read_s),
            ("write + merge", first.write_s + first.merge_s, last.write_s + last.merge_s),
        ):
            us_a, us_b = a / t * 1e6, b / t * 1e6
            say(
                us_b <= flat * us_a,
                f"{what} per key, {t:,} touched: {us_a:.2f} us at {first.state:,} keys, "
                f"{us_b:.2f} us at {last.state:,} ({us_b / us_a:.2f}x, goal <= {flat:g}x)",
            )
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
