"""A batch's state work costs the keys it touches, not the state: counted in SQLite VM steps.

Wall-clock time depends on the machine; the number of SQLite virtual-machine
instructions does not. A seek into a B-tree is one instruction whatever its
depth, so the steps of a read, a write and a merge of the same touched keys
stay the same when the stored state grows 25-fold, unless a statement scans.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.bulk import read_rows, write_rows
from dstl_client.state.store import LocalKeyedStore

RANGE = KeyGroupRange(0, 15)
TOUCHED = 400
#: progress-handler period, in VM instructions
PERIOD = 100


def _steps(store: LocalKeyedStore, fn: Callable[[], object]) -> int:
    """VM instructions (in units of PERIOD) that ``fn`` runs on the store's connection."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    store._db.set_progress_handler(tick, PERIOD)
    try:
        fn()
    finally:
        store._db.set_progress_handler(None, 0)
    return count


def _key(i: int) -> tuple[int, bytes]:
    return i % len(RANGE), b"key-%08d" % i


def _batch_steps(directory: Path, state: int, per_key: bool) -> dict[str, int]:
    """Steps of reading, writing and merging TOUCHED keys of a store of ``state`` keys."""
    rnd = random.Random(7)
    # half stored keys, half new; every fourth one deleted
    ids = rnd.sample(range(state), TOUCHED // 2) + list(range(state, state + TOUCHED // 2))
    addrs = [_key(i) for i in ids]
    values = [None if n % 4 == 0 else b"v%d" % n for n in range(len(ids))]
    with LocalKeyedStore(directory, RANGE) as store:
        store.write_main((*_key(i), b"x") for i in range(state))
        store.commit()
        keys = pa.table({"kg": [a for a, _ in addrs], "k": [b for _, b in addrs]})
        rows = keys.append_column("v", pa.array(values, pa.binary()))
        steps = {}
        if per_key:
            steps["read"] = _steps(store, lambda: [store.get(kg, k, True) for kg, k in addrs])
            triples = [(kg, k, v) for (kg, k), v in zip(addrs, values, strict=True)]
            steps["write"] = _steps(store, lambda: store.write_delta(triples))
        else:
            steps["read"] = _steps(store, lambda: read_rows(store, keys))
            steps["write"] = _steps(store, lambda: write_rows(store, rows))
        store.set_meta(delta_version=1, delta_attempt="a")
        store.commit()
        steps["merge"] = _steps(store, store.merge_delta)
        return steps


def _check_flat(tmp_path: Path, per_key: bool) -> None:
    small = _batch_steps(tmp_path / "small", 2_000, per_key)
    large = _batch_steps(tmp_path / "large", 50_000, per_key)
    for what, n in small.items():
        assert n > 0
        assert large[what] <= 1.2 * n + 5, (what, small, large)


def test_bulk_batches_cost_the_keys_touched(tmp_path: Path) -> None:
    _check_flat(tmp_path, per_key=False)


def test_per_key_batches_cost_the_keys_touched(tmp_path: Path) -> None:
    _check_flat(tmp_path, per_key=True)
