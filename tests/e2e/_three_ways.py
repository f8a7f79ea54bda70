"""Running issue 20's three-way jobs (:mod:`tests.e2e._three_ways_jobs`): on Spark's own
``transformWithStateInPandas`` (:func:`spark_outputs`) and on each dstl engine
(:func:`start`: ``transform_with_state`` or ``transform_batches``).

The input is one Parquet file per micro-batch (:func:`write_input`; the file
source reads the oldest first, one per trigger), so each batch's rows are
the same on every engine and in every re-run. The dstl engines write through
the exactly-once Parquet sink; :func:`read_outputs` gives each batch's rows
as a set, as :func:`spark_outputs` does.

Run as a script it is one driver process running :data:`COUNT_SUM` on every
dstl engine at once (each in ``<tmp>/<engine>``), to be killed by a test
when all of them reached a chosen phase of a chosen batch (one JVM start)::

    python -m tests.e2e._three_ways --tmp ... --crash tasks_done:2 ...
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dstl_client.processor import transform_with_state
from dstl_client.vectorized import transform_batches
from tests.e2e._both_engines import ROCKSDB, session_conf
from tests.e2e._harness import crash_at
from tests.e2e._three_ways_jobs import COUNT_SUM, Job, Outputs

ENGINES = ("processor", "vectorized")
MAX_P = 16


def write_input(directory: Path, job: Job, batches: range) -> None:
    """One Parquet file per batch of ``batches``, older modification times for earlier ones."""
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 1000
    for b in batches:
        table = pa.Table.from_pylist(
            [dict(zip(job.input_arrow.names, row, strict=True)) for row in job.batches[b]],
            schema=job.input_arrow,
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


def _events(spark: Any, job: Job, input_dir: Path) -> Any:
    return (
        spark.readStream.schema(job.input_schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )


def spark_outputs(spark: Any, job: Job, tmp: Path, timeout_s: float = 240) -> Outputs:
    """``job`` on Spark's own ``transformWithStateInPandas`` (RocksDB) over its whole input
    (written to ``tmp/input``): the output of each batch with input."""
    write_input(tmp / "input", job, range(len(job.batches)))
    got: Outputs = {}

    def collect(df: Any, batch_id: int) -> None:
        got[batch_id] = {tuple(r) for r in df.collect()}

    with session_conf(spark, {"spark.sql.streaming.stateStore.providerClass": ROCKSDB}):
        events = _events(spark, job, tmp / "input")
        if job.watermark is not None:
            events = events.withWatermark(*job.watermark)
        q = (
            events.groupBy("k")
            .transformWithStateInPandas(job.processor(), job.output_schema, "Update", job.time_mode)
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp / "ckpt"))
            .outputMode("update")
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert q.awaitTermination(timeout_s), "Spark's query did not finish in time"
        finally:
            q.stop()
    # Spark may add a batch without input at the end, to move the watermark
    return {b: rows for b, rows in got.items() if b < len(job.batches)}


def start(
    spark: Any,
    engine: str,
    tmp: Path,
    address: str,
    *,
    job: Job = COUNT_SUM,
    state_dir: Path | None = None,
    parallelism: int = 2,
    on_phase: Callable[[str, int], None] | None = None,
) -> Any:
    """``job`` on dstl ``engine`` (``"processor"`` or ``"vectorized"``) over ``tmp/input``
    with ``availableNow``: every input file there, one per batch; its checkpoint in
    ``tmp/ckpt``, its output in ``tmp/out``.

    No materialization after the first: a restore replays the changelog."""
    options: dict[str, Any] = {
        "output_schema": job.output_schema,
        "time_mode": job.time_mode,
        "parallelism": parallelism,
        "max_parallelism": MAX_P,
        "job_id": f"three-ways-{engine}-{tmp.name[-24:].strip('_-.')}",
        "dstl_address": address,
        "state_dir": str(state_dir or tmp / "state"),
        "orphan_grace_s": 0,
        "materialize_interval_s": 3600,
        "on_phase": on_phase,
    }
    if job.watermark is not None:
        options["event_time_column"], options["watermark_delay"] = job.watermark
    events = _events(spark, job, tmp / "input")
    if engine == "processor":
        stream = transform_with_state(
            events.groupBy("k"), processor=job.processor(), output_mode="Update", **options
        )
    else:
        assert engine == "vectorized", engine
        stream = transform_batches(
            events, key="k", fn=job.fn, state_schema=job.state_schema, frame="arrow", **options
        )
    return (
        stream.writeStream.format("parquet")
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
            got.setdefault(batch, set()).add(tuple(r.values()))
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
