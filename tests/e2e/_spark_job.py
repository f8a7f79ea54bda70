"""The keyed Spark job of the end-to-end tests, its input and its expected results.

Run as a script it is one driver process (so a test can kill it with SIGKILL
at a chosen point of a chosen batch and start it again)::

    python -m tests.e2e._spark_job --checkpoint-dir ... --crash tasks_done:3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from dstl_client.state import INT64, TupleSerializer
from dstl_server.testing import ServerProcess
from loadtest.cluster_bench.job import MAX_P as MAX_P
from loadtest.cluster_bench.job import OUTPUT_SCHEMA as OUTPUT_SCHEMA
from loadtest.cluster_bench.job import output_sink as output_sink
from loadtest.cluster_bench.workload import batch_rows as batch_rows
from loadtest.cluster_bench.workload import fold_groups
from tests.e2e._harness import crash_at

AGG: TupleSerializer[Any] = TupleSerializer(INT64, INT64)
OUTPUT_COLUMNS = ("k", "count", "total")


def agg(key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
    """Running count and sum of ``v`` per key; one output row per key and batch."""
    state = ctx.value_state("agg", AGG)
    count, total = state.value() or (0, 0)
    for r in rows:
        count += 1
        total += r["v"]
    state.update((count, total))
    yield key, count, total


def write_input(directory: Path, first: int, last: int, rows: int, keys: int) -> None:
    """Batches ``first..last`` as one Parquet file each (the file source reads oldest first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 1000
    for b in range(first, last + 1):
        data = batch_rows(b, rows, keys)
        table = pa.table(
            {"k": [k for k, _ in data], "v": pa.array([v for _, v in data], pa.int64())}
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


def expected(
    batches: int, rows: int, keys: int
) -> tuple[dict[str, tuple[int, int]], set[tuple[int, str, int, int]]]:
    """Final state per key and every output row ``(batch, key, count, total)``."""
    return expected_grouped([range(b, b + 1) for b in range(batches)], rows, keys)


def expected_grouped(
    groups: list[range], rows: int, keys: int
) -> tuple[dict[str, tuple[int, int]], set[tuple[int, str, int, int]]]:
    """:func:`expected` when batch ``b`` read input files ``groups[b]`` (see
    :func:`loadtest.spark_offsets.file_groups`)."""
    state, outputs = fold_groups(groups, rows, keys)
    return state, set(outputs)


def decode_state(rows: dict[tuple[int, bytes], bytes]) -> dict[str, tuple[int, int]]:
    from dstl_client.state.changes import decode_state_key

    out = {}
    for (_kg, k), v in rows.items():
        name, key, _ = decode_state_key(k)
        assert name == "agg"
        out[key.decode()] = AGG.loads(v)
    return out


def read_outputs(out_dir: Path) -> set[tuple[int, str, int, int]]:
    import pyarrow.parquet as pq

    got: set[tuple[int, str, int, int]] = set()
    for d in sorted(out_dir.glob("batch=*")):
        b = int(d.name.split("=")[1])
        for row in pq.read_table(d).to_pylist():
            got.add((b, row["k"], row["count"], row["total"]))
    return got


#: the test JVMs' options: the client compiler only and the serial collector start a
#: JVM and run the tests' small jobs about 40 % faster on 2 cores than the default
#: (C2 and G1 threads compete with the tasks for the cores); the multi-node tests give
#: them to every JVM of their standalone cluster (``SparkCluster(jvm_options=...)``)
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def session(cores: str = "2") -> Any:
    """A local Spark session (``local[<cores>]``) set up for tests."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def agg_job(
    spark: Any,
    *,
    input_dir: Path,
    checkpoint_dir: Path,
    address: str,
    state_dir: Path,
    out_dir: Path,
    fn: Any = agg,
    parallelism: int = 2,
    job_id: str = "e2e",
    **kw: Any,
) -> Any:
    """``fn``'s keyed job (``agg`` unless said) over the Parquet files of ``input_dir``,
    one file per micro-batch, its rows to the ``out_dir`` sink; ``kw``: more options."""
    from dstl_client.spark import process_keyed

    df = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    return process_keyed(
        df,
        key="k",
        fn=fn,
        output_schema=OUTPUT_SCHEMA,
        parallelism=parallelism,
        max_parallelism=MAX_P,
        checkpoint_dir=str(checkpoint_dir),
        job_id=job_id,
        dstl_address=address,
        state_dir=str(state_dir),
        sink=output_sink(out_dir),
        **kw,
    )


def agg_job_in(spark: Any, tmp: Path, address: str, **kw: Any) -> Any:
    """:func:`agg_job` with the tests' layout under ``tmp``: ``input``, ``ckpt``, ``state``, ``out``."""
    return agg_job(
        spark,
        input_dir=tmp / "input",
        checkpoint_dir=tmp / "ckpt",
        address=address,
        state_dir=tmp / "state",
        out_dir=tmp / "out",
        **kw,
    )


def start_agg(
    spark: Any, tmp: Path, sidecar: ServerProcess, parallelism: int, fn: Any = agg, **kw: Any
) -> Any:
    """:func:`agg_job_in` at ``parallelism`` with a job id made of ``tmp``'s name."""
    return agg_job_in(
        spark,
        tmp,
        sidecar.address,
        fn=fn,
        parallelism=parallelism,
        job_id=f"e2e-{tmp.name[-20:].strip('_-.') or 'job'}",
        **kw,
    )


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("checkpoint-dir", "address", "state-dir", "input-dir", "out-dir"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--until-batch", type=int, required=True)
    p.add_argument("--crash", default="", help="phase:batch -> SIGKILL the driver there")
    p.add_argument("--job-id", default="e2e-crash")
    # the job's checkpoint metadata elsewhere (s3://...; default: under --checkpoint-dir)
    p.add_argument("--metadata-url", default="")
    p.add_argument("--metadata-s3-endpoint-url", default="")
    p.add_argument("--metadata-s3-region", default="")
    args = p.parse_args()
    on_phase = crash_at(args.crash)
    spark = session()
    q = agg_job(
        spark,
        input_dir=Path(args.input_dir),
        checkpoint_dir=Path(args.checkpoint_dir),
        address=args.address,
        state_dir=Path(args.state_dir),
        out_dir=Path(args.out_dir),
        parallelism=args.parallelism,
        job_id=args.job_id,
        metadata_url=args.metadata_url,
        metadata_s3_endpoint_url=args.metadata_s3_endpoint_url,
        metadata_s3_region=args.metadata_s3_region,
        # nothing else of the job runs: every unreferenced object is an orphan of a crash
        orphan_grace_s=0,
        materialize_interval_s=0,
        on_phase=on_phase,
    )
    try:
        q.wait_for_batch(args.until_batch, timeout_s=240)
    finally:
        q.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
