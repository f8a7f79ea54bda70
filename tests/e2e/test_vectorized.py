"""The vectorized API in a real PySpark job: the contract's count-and-sum over file batches
equals a pandas computation of the same, across a restart from the checkpoint (with the
node's state gone and the parallelism changed 2 -> 3: a restore and a rescale)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from dstl_client.vectorized import BatchInput, BatchOutput, transform_batches
from dstl_server.testing import ServerProcess

pytestmark = [pytest.mark.spark]

BATCHES = 4
ROWS = 300


def count_sum(batch: BatchInput) -> BatchOutput:
    import pyarrow as pa
    import pyarrow.compute as pc

    agg = batch.rows.group_by("k").aggregate([("v", "count"), ("v", "sum")])
    joined = agg.join(batch.state, "k", join_type="left outer")
    new = pa.table(
        {
            "k": joined.column("k"),
            "count": pc.add(joined.column("v_count"), pc.fill_null(joined.column("count"), 0)),
            "total": pc.add(joined.column("v_sum"), pc.fill_null(joined.column("total"), 0)),
        }
    )
    return BatchOutput(output=new, upserts=new)


def _write(directory: Path, b: int) -> Any:
    import numpy as np
    import pandas as pd

    rnd = np.random.default_rng(b)
    frame = pd.DataFrame(
        {"k": rnd.integers(0, 80, ROWS, dtype="int64"), "v": rnd.integers(-9, 99, ROWS)}
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{b:05d}.parquet"
    frame.to_parquet(path, index=False)
    at = time.time() - 1000 + b
    os.utime(path, (at, at))
    return frame


def _expected(frames: list[Any]) -> dict[int, list[tuple[int, int, int]]]:
    """Per batch, each key of the batch with its count and sum over every batch so far."""
    import pandas as pd

    out = {}
    for b in range(len(frames)):
        upto = pd.concat(frames[: b + 1]).groupby("k")["v"].agg(["count", "sum"])
        keys = sorted(set(frames[b]["k"]))
        out[b] = [(int(k), int(upto.loc[k, "count"]), int(upto.loc[k, "sum"])) for k in keys]
    return out


def test_count_sum_equals_pandas_across_a_restart_with_restore_and_rescale(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    inputs = tmp_path / "input"
    frames = [_write(inputs, b) for b in range(2)]
    got: dict[int, list[tuple[int, int, int]]] = {}

    def sink(df: Any, batch_id: int) -> None:
        got[batch_id] = sorted(tuple(r) for r in df.collect())

    def run(parallelism: int) -> None:
        events = (
            spark.readStream.schema("k long, v long")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(inputs))
        )
        q = (
            transform_batches(
                events,
                key="k",
                fn=count_sum,
                state_schema="count long, total long",
                output_schema="k long, count long, total long",
                parallelism=parallelism,
                max_parallelism=16,
                dstl_address=sidecar.address,
                state_dir=str(tmp_path / "state"),
            )
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .outputMode("update")
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.await_termination(240)
        finally:
            q.stop()

    run(2)
    assert sorted(got) == [0, 1]
    shutil.rmtree(tmp_path / "state")  # the node's disk is gone: the tasks restore
    frames += [_write(inputs, b) for b in range(2, BATCHES)]
    run(3)
    assert got == _expected(frames)
