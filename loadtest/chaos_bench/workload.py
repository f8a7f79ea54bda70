"""The chaos job's input, its failure-free expectation and its outputs.

File ``f`` holds ``rows`` events ``(k, ts, at, v)``; its event times lie in
``[f * SPAN_MS, (f + 1) * SPAN_MS)`` after :data:`T0_MS`, increasing with the
row. Keys move through a window: file ``f`` touches keys
``(f * SHIFT + j) % keys`` for ``j < keys // 2``, so each key is seen in a few
consecutive files and then not for as many; its idle timer (``IDLE_MS``
after its latest event) fires in some of those gaps, before the key comes
back or not. Every :data:`LATE_EVERY`-th row of the files from
:data:`LATE_FROM` on lies :data:`LATE_BACK` spans in the past: late whatever
the batching (see :func:`expected_outputs`).

The job (:mod:`loadtest.chaos_bench.job`) keeps per key a count and sum of
``v`` and the distinct ``v % BUCKETS`` seen (map state), outputs an
``update`` row per key and batch and an ``idle`` row (then clears the key)
when its timer fires. The expectation follows the batches Spark committed:
which input files each read (:func:`loadtest.spark_offsets.file_groups`) and
the watermark Spark gave it (its offsets log entry, :func:`batch_watermarks`),
as a failure-free run of those same batches would output them.

Pure functions over local files; any thread.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

#: event times start here (ms since the epoch; 2024-01-01 UTC)
T0_MS = 1_704_067_200_000
SPAN_MS = 60_000
DELAY = "10 seconds"
DELAY_MS = 10_000
IDLE_MS = 100_000
BUCKETS = 5
SHIFT = 40
LATE_FROM = 8
LATE_EVERY = 97
LATE_BACK = 7
INPUT_SCHEMA = "k string, ts timestamp, at long, v long"
OUTPUT_SCHEMA = "k string, kind string, count long, total long, buckets long, at long"

Event = tuple[str, int, int]
"""One input row: ``(key, at ms, v)``."""
Output = tuple[int, str, str, int, int, int, int]
"""One output row: ``(batch, key, kind, count, total, buckets, at)``."""


def file_rows(f: int, rows: int, keys: int) -> list[Event]:
    """The rows of input file ``f`` (see the module docstring)."""
    window = max(1, keys // 2)
    out: list[Event] = []
    for j in range(rows):
        i = f * rows + j
        key = f"k{(f * SHIFT + (i * 7919) % window) % keys}"
        at = T0_MS + f * SPAN_MS + j * SPAN_MS // rows
        if f >= LATE_FROM and j % LATE_EVERY == LATE_EVERY - 1:
            at -= LATE_BACK * SPAN_MS
        out.append((key, at, i % 97))
    return out


def write_input(directory: Path, files: int, rows: int, keys: int) -> None:
    """Files ``0..files-1`` as Parquet, modification times in order (read oldest first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 100_000
    for f in range(files):
        data = file_rows(f, rows, keys)
        table = pa.table(
            {
                "k": [k for k, _, _ in data],
                "ts": pa.array([at * 1000 for _, at, _ in data], pa.timestamp("us", "UTC")),
                "at": pa.array([at for _, at, _ in data], pa.int64()),
                "v": pa.array([v for _, _, v in data], pa.int64()),
            }
        )
        path = directory / f"part-{f:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + f, base + f))


def batch_watermarks(spark_ckpt: Path, batches: int) -> list[int]:
    """``batchWatermarkMs`` of the offsets log entries of batches ``0..batches-1``."""
    marks: list[int] = []
    for b in range(batches):
        lines = (spark_ckpt / "offsets" / str(b)).read_text().strip().splitlines()
        meta = json.loads(lines[1]) if len(lines) > 1 else {}
        marks.append(int(meta.get("batchWatermarkMs", 0)))
    return marks


@dataclass(frozen=True, slots=True)
class Expectation:
    """What a failure-free run of the committed batches outputs, and how sure that is."""

    outputs: Counter[Output]
    late_rows: int
    #: rows late under one of Spark's two lateness bounds (this batch's watermark or the
    #: previous one) and not the other: the workload keeps this 0 (then both agree)
    ambiguous_rows: int


def expected_outputs(
    groups: list[range], watermarks: list[int], rows: int, keys: int
) -> Expectation:
    """Every output row of batches reading ``groups[b]`` at watermark ``watermarks[b]``.

    Per batch: rows at or before the watermark are dropped as late; the
    others update their key (in input order); then every timer at or before
    the watermark fires (an ``idle`` row, the key's state cleared).
    """
    state: dict[str, tuple[int, int, set[int], int]] = {}  # count, total, buckets, timer
    outputs: Counter[Output] = Counter()
    late = ambiguous = 0
    previous = 0
    for b, files in enumerate(groups):
        mark = watermarks[b]
        touched: dict[str, int] = {}
        for f in files:
            for key, at, v in file_rows(f, rows, keys):
                if (at <= mark) != (at <= previous):
                    ambiguous += 1
                if at <= mark:
                    late += 1
                    continue
                count, total, buckets, _ = state.get(key, (0, 0, set(), 0))
                buckets = buckets | {v % BUCKETS}
                latest = max(at, touched.get(key, at))
                touched[key] = latest
                state[key] = (count + 1, total + v, buckets, latest + IDLE_MS)
        for key, latest in touched.items():
            count, total, buckets, _ = state[key]
            outputs[(b, key, "update", count, total, len(buckets), latest)] += 1
        for key in [k for k, s in state.items() if s[3] <= mark]:
            count, total, buckets, timer = state.pop(key)
            outputs[(b, key, "idle", count, total, len(buckets), timer)] += 1
        previous = mark
    return Expectation(outputs, late, ambiguous)


def read_outputs(out_dir: Path) -> Counter[Output]:
    """The rows the job's exactly-once file sink wrote, per batch (a multiset)."""
    import pyarrow.parquet as pq

    from dstl_client.processor.sinks import batch_file_prefix

    got: Counter[Output] = Counter()
    for path in sorted(out_dir.glob("part-b*.parquet")):
        batch = int(path.name[len("part-b") :].split("-", 1)[0])
        assert path.name.startswith(batch_file_prefix(batch))
        for r in pq.read_table(path).to_pylist():
            row = (r["k"], r["kind"], r["count"], r["total"], r["buckets"], r["at"])
            got[(batch, *row)] += 1
    return got
