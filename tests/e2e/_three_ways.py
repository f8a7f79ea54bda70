"""The count-and-sum job of issue 20, three ways: Spark's ``transformWithStateInPandas``,
dstl's ``transform_with_state`` and dstl's vectorized ``transform_batches``.

Per key ``k``: ``count += rows``, ``total += sum(v)``, and the key's new
``(k, count, total)`` is output (Update mode). :class:`CountSum` is one
``StatefulProcessor`` (Spark's own base class) that both Spark and
``transform_with_state`` run; :func:`count_sum` is the same job as one
vectorized function per key-group range and micro-batch (Arrow tables).

The input is one Parquet file per micro-batch (:func:`write_input`; the file
source reads the oldest first, one per trigger), so each batch's rows are
the same on every engine and in every re-run. The dstl engines write through
the exactly-once Parquet sink (:func:`start`); :func:`read_outputs` gives
each batch's rows as a set.

Run as a script it is one driver process running the job on every dstl
engine at once (each in ``<tmp>/<engine>``), to be killed by a test when
all of them reached a chosen phase of a chosen batch (one JVM start for all)::

    python -m tests.e2e._three_ways --tmp ... --crash tasks_done:2 ...
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkStatefulProcessor

from dstl_client.processor import transform_with_state
from dstl_client.vectorized import BatchInput, BatchOutput, transform_batches
from tests.e2e._harness import crash_at

INPUT_SCHEMA = "k long, v long"
STATE_SCHEMA = "count long, total long"
OUTPUT_SCHEMA = "k long, count long, total long"
ENGINES = ("processor", "vectorized")
BATCHES = 4
ROWS = 120
MAX_P = 16

#: one output row: ``(k, count, total)``
Output = tuple[int, int, int]
#: the output rows per batch id
Outputs = dict[int, set[Output]]


def batch_rows(batch: int) -> list[tuple[int, int]]:
    """Batch ``batch``'s input rows ``(k, v)``: repeated keys, keys new in later batches."""
    rng = random.Random(20 + batch)
    return [(rng.randrange(30 + 6 * batch), rng.randrange(-50, 100)) for _ in range(ROWS)]


def expected(batches: int = BATCHES) -> Outputs:
    """What the job outputs for batches ``0..batches-1``, folded here in plain Python."""
    state: dict[int, tuple[int, int]] = {}
    out: Outputs = {}
    for b in range(batches):
        touched = set()
        for k, v in batch_rows(b):
            count, total = state.get(k, (0, 0))
            state[k] = (count + 1, total + v)
            touched.add(k)
        out[b] = {(k, *state[k]) for k in touched}
    return out


def write_input(directory: Path, batches: range) -> None:
    """One Parquet file per batch of ``batches``, older modification times for earlier ones."""
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 1000
    for b in batches:
        rows = batch_rows(b)
        table = pa.table(
            {
                "k": pa.array([k for k, _ in rows], pa.int64()),
                "v": pa.array([v for _, v in rows], pa.int64()),
            }
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


class CountSum(SparkStatefulProcessor):  # type: ignore[misc]
    """Count and sum of ``v`` per key in one value state; one output row per key and batch.

    Spark's own base class: the same class runs on ``transformWithStateInPandas``
    and on dstl's ``transform_with_state``.
    """

    def init(self, handle: Any) -> None:
        self.agg = handle.getValueState("agg", STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        count, total = self.agg.get() if self.agg.exists() else (0, 0)
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["v"].sum())
        self.agg.update((count, total))
        yield pd.DataFrame({"k": [int(key[0])], "count": [count], "total": [total]})

    def close(self) -> None:
        pass


def count_sum(batch: BatchInput) -> BatchOutput:
    """The job as one vectorized step per key-group range: aggregate the batch per key,
    add the state (absent: zero), output and upsert the new ``(count, total)``."""
    per_key = batch.rows.group_by("k").aggregate([("v", "count"), ("v", "sum")])
    joined = per_key.join(batch.state, "k", join_type="left outer")
    new = pa.table(
        {
            "k": joined["k"],
            "count": pc.add(pc.coalesce(joined["count"], 0), joined["v_count"]),
            "total": pc.add(pc.coalesce(joined["total"], 0), joined["v_sum"]),
        }
    )
    return BatchOutput(output=new, upserts=new)


def stream(spark: Any, engine: str, input_dir: Path, **options: Any) -> Any:
    """The job's output stream on dstl ``engine`` (``"processor"`` or ``"vectorized"``)."""
    events = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    if engine == "processor":
        return transform_with_state(
            events.groupBy("k"),
            processor=CountSum(),
            output_schema=OUTPUT_SCHEMA,
            output_mode="Update",
            time_mode="None",
            **options,
        )
    assert engine == "vectorized", engine
    return transform_batches(
        events,
        key="k",
        fn=count_sum,
        state_schema=STATE_SCHEMA,
        output_schema=OUTPUT_SCHEMA,
        frame="arrow",
        **options,
    )


def start(
    spark: Any,
    engine: str,
    tmp: Path,
    address: str,
    *,
    state_dir: Path | None = None,
    parallelism: int = 2,
    on_phase: Callable[[str, int], None] | None = None,
) -> Any:
    """The job on ``engine`` over ``tmp/input`` with ``availableNow``: every input file
    there, one per batch; its checkpoint in ``tmp/ckpt``, its output in ``tmp/out``.

    No materialization after the first: a restore replays the changelog."""
    return (
        stream(
            spark,
            engine,
            tmp / "input",
            parallelism=parallelism,
            max_parallelism=MAX_P,
            job_id=f"three-ways-{engine}-{tmp.name[-24:].strip('_-.')}",
            dstl_address=address,
            state_dir=str(state_dir or tmp / "state"),
            orphan_grace_s=0,
            materialize_interval_s=3600,
            on_phase=on_phase,
        )
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp / "ckpt"))
        .outputMode("update")
        .trigger(availableNow=True)
        .start(str(tmp / "out"))
    )


def run_to_end(query: Any, timeout_s: float = 180) -> None:
    """Wait until the ``availableNow`` query ``query`` ran out of input (raises its failure)."""
    try:
        assert query.await_termination(timeout_s), "the query did not finish in time"
    finally:
        query.stop()


def read_outputs(out_dir: Path) -> Outputs:
    """The exactly-once sink's rows per batch (the batch id is in each file's name)."""
    import pyarrow.parquet as pq

    got: Outputs = {}
    for path in sorted(out_dir.glob("part-b*.parquet")):
        batch = int(path.name[len("part-b") :].split("-", 1)[0])
        for r in pq.read_table(path).to_pylist():
            got.setdefault(batch, set()).add((r["k"], r["count"], r["total"]))
    return got


def crash_together(spec: str, queries: int) -> Callable[[str, int], None]:
    """An ``on_phase`` for ``queries`` queries of this driver: each waits at ``phase:batch``
    until all of them are there, then the driver's process group is SIGKILLed (bounded:
    a query that never gets there breaks the wait after 180 s)."""
    phase, _, batch = spec.partition(":")
    barrier = threading.Barrier(queries, timeout=180)
    crash = crash_at(spec)

    def on_phase(at: str, batch_id: int) -> None:
        if phase and (at, batch_id) == (phase, int(batch)):
            barrier.wait()
        crash(at, batch_id)

    return on_phase


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tmp", type=Path, required=True, help="<tmp>/<engine>: each job's files")
    p.add_argument("--address", required=True)
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--crash", default="", help="phase:batch -> SIGKILL the driver there")
    args = p.parse_args()
    from tests.e2e._spark_job import session

    spark = session()
    on_phase = crash_together(args.crash, len(ENGINES))
    try:
        queries = [
            start(
                spark,
                engine,
                args.tmp / engine,
                args.address,
                state_dir=args.state_dir / engine,
                on_phase=on_phase,
            )
            for engine in ENGINES
        ]
        for q in queries:
            run_to_end(q)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
