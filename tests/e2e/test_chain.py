"""Two keyed operators chained in one query: separate state and records, exactly-once
across a crash that left a batch recorded by the second stage only."""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from dstl_client.coordinator.metadata import open_metadata_store
from dstl_client.coordinator.storage import CheckpointStorage
from dstl_client.core.errors import ConfigError
from dstl_client.spark import KeyedStage, process_chain
from dstl_client.state import INT64
from dstl_server.testing import ServerProcess
from tests.e2e._spark_job import batch_rows, write_input

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS, KEYS, BUCKETS = 300, 40, 3


def count_per_key(key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
    """Stage 1: the running number of rows of the key, and its bucket."""
    n = ctx.value_state("n", INT64)
    total = (n.value() or 0) + len(rows)
    n.update(total)
    yield key, total, total % BUCKETS


def per_bucket(key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
    """Stage 2: per bucket, rows seen and the sum of the stage-1 counts they carried."""
    seen = ctx.value_state("seen", INT64)
    summed = ctx.value_state("sum", INT64)
    seen.update((seen.value() or 0) + len(rows))
    summed.update((summed.value() or 0) + sum(r["n"] for r in rows))
    yield key, seen.value(), summed.value()


def per_bucket_slow_once(marker: Path, key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
    """``per_bucket``, but its first attempt of batch 1 outlives the checkpoint timeout."""
    if ctx.batch_id == 1 and not marker.exists():
        marker.touch()
        time.sleep(120)  # cancelled by the abort long before
    return per_bucket(key, rows, ctx)


def model(batches: int) -> set[tuple[int, int, int, int]]:
    """Every output row ``(batch, bucket, seen, sum)`` of a failure-free run."""
    n: dict[str, int] = defaultdict(int)
    seen: dict[int, int] = defaultdict(int)
    summed: dict[int, int] = defaultdict(int)
    out: set[tuple[int, int, int, int]] = set()
    for b in range(batches):
        per_key: dict[str, int] = defaultdict(int)
        for k, _ in batch_rows(b, ROWS, KEYS):
            per_key[k] += 1
        touched: set[int] = set()
        for k, c in per_key.items():
            n[k] += c
            bucket = n[k] % BUCKETS
            seen[bucket] += 1
            summed[bucket] += n[k]
            touched.add(bucket)
        out |= {(b, x, seen[x], summed[x]) for x in touched}
    return out


def sink_to(out: Path) -> Any:
    def sink(df: Any, batch_id: int) -> None:  # replaces the batch: idempotent
        df.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))

    return sink


def read(out: Path) -> set[tuple[int, int, int, int]]:
    import pyarrow.parquet as pq

    got: set[tuple[int, int, int, int]] = set()
    for d in out.glob("batch=*"):
        b = int(d.name.split("=")[1])
        got |= {(b, r["bucket"], r["seen"], r["sum"]) for r in pq.read_table(d).to_pylist()}
    return got


def start(
    spark: Any, tmp: Path, sidecar: ServerProcess, second: Any = per_bucket, **options: Any
) -> Any:
    """The two-stage chain on ``tmp``'s input; ``second`` is the second stage's function."""
    df = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp / "input"))
    )
    return process_chain(
        df,
        stages=[
            KeyedStage(
                "per-key", key="k", fn=count_per_key, output_schema="k string, n long, bucket long"
            ),
            KeyedStage(
                "per-bucket",
                key="bucket",
                fn=second,
                output_schema="bucket long, seen long, sum long",
                parallelism=1,
            ),
        ],
        parallelism=2,
        max_parallelism=16,
        checkpoint_dir=str(tmp / "ckpt"),
        job_id=f"chain-{tmp.name[-20:].strip('_-.') or 'job'}",
        dstl_address=sidecar.address,
        state_dir=str(tmp / "state"),
        sink=sink_to(tmp / "out"),
        **options,
    )


def storage(tmp: Path, operator: str) -> CheckpointStorage:
    store = open_metadata_store(str(tmp / "ckpt" / "dstl"))
    return CheckpointStorage(store, f"operators/{operator}/checkpoints/")


def test_a_chain_keeps_separate_state_and_is_exactly_once_after_a_half_recorded_batch(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    write_input(tmp_path / "input", 0, 2, ROWS, KEYS)
    q = start(spark, tmp_path, sidecar)
    try:
        q.wait_for_batch(2, timeout_s=180)
    finally:
        q.stop()
    first, second = storage(tmp_path, "per-key"), storage(tmp_path, "per-bucket")
    # each stage has its own records, with its own parallelism
    assert first.batch_ids()[-1] == second.batch_ids()[-1] == 2
    assert first.load(2).parallelism == 2 and second.load(2).parallelism == 1
    assert read(tmp_path / "out") == model(3)

    # What a driver crash between the two records of batch 2 leaves: the second
    # stage recorded it (after the sink), the first did not, Spark did not commit it.
    first.delete(2)
    # (q.stop() may already have stopped Spark between our record and its commit)
    commits = tmp_path / "ckpt" / "spark" / "commits"
    (commits / "2").unlink(missing_ok=True)
    (commits / ".2.crc").unlink(missing_ok=True)
    write_input(tmp_path / "input", 3, 4, ROWS, KEYS)
    q = start(spark, tmp_path, sidecar)
    try:
        q.wait_for_batch(4, timeout_s=180)
    finally:
        q.stop()
    stage_one = {h.batch_id for h in q.coordinators[0].history}
    stage_two = {h.batch_id for h in q.coordinators[1].history}
    assert 2 in stage_one and 2 not in stage_two  # only the unrecorded stage re-ran it
    # no row counted twice in either stage: batch 3 and 4 carry the failure-free figures
    assert read(tmp_path / "out") == model(5)


def test_a_chain_checkpoint_that_times_out_is_run_again_and_the_query_goes_on(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    write_input(tmp_path / "input", 0, 2, ROWS, KEYS)
    marker = tmp_path / "slow-once"
    q = start(
        spark,
        tmp_path,
        sidecar,
        second=functools.partial(per_bucket_slow_once, marker),
        checkpoint_timeout_s=30.0,  # (two stages on a shared machine: a margin)
        tolerable_failed_checkpoints=2,
    )
    try:
        q.wait_for_batch(2, timeout_s=300)
    finally:
        q.stop()
    assert marker.exists()  # the slow attempt ran, and was aborted
    assert q.failures is not None and q.failures.tolerated >= 1  # (a slow machine: more)
    # the re-run started from the last records: no row counted twice in either stage
    assert read(tmp_path / "out") == model(3)


def test_stage_operator_ids_must_differ(spark: Any, tmp_path: Path) -> None:
    df = spark.readStream.schema("k string, v long").parquet(str(tmp_path))
    stage = KeyedStage("same", key="k", fn=count_per_key, output_schema="k string, n long")
    with pytest.raises(ConfigError, match="must differ"):
        process_chain(df, stages=[stage, stage], parallelism=1, checkpoint_dir=str(tmp_path))
