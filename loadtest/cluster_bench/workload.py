"""The benchmark's input, its failure-free expectation and the job's outputs.

Batch ``b`` is ``rows`` rows ``(k, v)``: row ``i`` (counted over the whole
stream) has key ``k{(i * 7919) % keys}`` and value ``i % 97``, one Parquet
file per batch (the file source reads one file per trigger, oldest first).
The job keeps a running count and sum of ``v`` per key and emits one row
``(k, count, total)`` per key touched by the batch, so the expectation is
computed here without Spark.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

Output = tuple[int, str, int, int]
"""One output row: ``(batch, key, count, total)``."""
Row = TypeVar("Row", bound=tuple[Any, ...])


def batch_rows(b: int, rows: int, keys: int) -> list[tuple[str, int]]:
    first = b * rows
    return [(f"k{(i * 7919) % keys}", i % 97) for i in range(first, first + rows)]


def write_input(directory: Path, batches: int, rows: int, keys: int) -> None:
    """Batches ``0..batches-1`` as one Parquet file each, modification times in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 100_000
    for b in range(batches):
        data = batch_rows(b, rows, keys)
        table = pa.table(
            {"k": [k for k, _ in data], "v": pa.array([v for _, v in data], pa.int64())}
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


def expected_outputs(
    batches: int, rows: int, keys: int, groups: list[range] | None = None
) -> Counter[Output]:
    """Every output row of a failure-free run, each exactly once.

    ``groups[b]``: the input files batch ``b`` read (one file per batch if
    None; see :func:`loadtest.spark_offsets.file_groups` for why a batch can
    read two).
    """
    if groups is None:
        groups = [range(b, b + 1) for b in range(batches)]
    return fold_groups(groups, rows, keys)[1]


def fold_groups(
    groups: list[range], rows: int, keys: int
) -> tuple[dict[str, tuple[int, int]], Counter[Output]]:
    """The failure-free final state per key and output rows when batch ``b`` reads ``groups[b]``."""
    state: dict[str, tuple[int, int]] = {}
    outputs: Counter[Output] = Counter()
    for b, files in enumerate(groups):
        touched: set[str] = set()
        for k, v in (row for f in files for row in batch_rows(f, rows, keys)):
            c, t = state.get(k, (0, 0))
            state[k] = (c + 1, t + v)
            touched.add(k)
        for k in touched:
            outputs[(b, k, *state[k])] += 1
    return state, outputs


def read_outputs(out_dir: Path) -> Counter[Output]:
    """The rows the job's sink wrote (a multiset: a duplicated row counts twice)."""
    import pyarrow.parquet as pq

    got: Counter[Output] = Counter()
    for d in sorted(out_dir.glob("batch=*")):
        b = int(d.name.split("=", 1)[1])
        for row in pq.read_table(d).to_pylist():
            got[(b, row["k"], row["count"], row["total"])] += 1
    return got


def compare(want: Counter[Row], got: Counter[Row], show: int = 5) -> tuple[int, int, str]:
    """``(missing, unexpected, sample)``: rows short of / beyond the expectation."""
    missing = want - got
    extra = got - want
    sample = ""
    if missing or extra:
        sample = f"missing e.g. {sorted(missing)[:show]}; unexpected e.g. {sorted(extra)[:show]}"
    return sum(missing.values()), sum(extra.values()), sample
