"""The output of ``transform_with_state`` as users go on with it: the memory sink's view in
their session, stateless steps after the operator, a second stateful stage on the first's
event time (Spark's chaining with ``eventTimeColumnName``), and typed errors for the rest."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.processor import StatefulProcessor, transform_with_state
from dstl_server.testing import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: per batch (one input file each): (key, value)
COUNT_BATCHES = [
    [("a", 1), ("b", 2), ("a", 3)],
    [("b", 4), ("c", 5)],
    [("a", 6)],
]


class RunningSum(StatefulProcessor):
    """Per key: the running count and sum of ``v`` (``Row``\\ s in and out)."""

    def init(self, handle: Any) -> None:
        self.total = handle.getValueState("total", "n long, s long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Any:
        from pyspark.sql import Row

        got = self.total.get()
        n, s = (0, 0) if got is None else (got[0], got[1])
        for row in rows:
            n, s = n + 1, s + row.v
        self.total.update((n, s))
        yield Row(k=key[0], n=n, s=s)


def _write_batches(directory: Path, batches: list[list[tuple[str, int]]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 1000
    for b, rows in enumerate(batches):
        table = pa.table(
            {"k": [k for k, _ in rows], "v": pa.array([v for _, v in rows], pa.int64())}
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


def _model(batches: list[list[tuple[str, int]]]) -> list[tuple[str, int, int]]:
    """Every output row ``(k, n, s)`` of :class:`RunningSum` over ``batches``."""
    n: dict[str, int] = {}
    s: dict[str, int] = {}
    out = []
    for rows in batches:
        for k in dict.fromkeys(k for k, _ in rows):
            for key, v in rows:
                if key == k:
                    n[k] = n.get(k, 0) + 1
                    s[k] = s.get(k, 0) + v
            out.append((k, n[k], s[k]))
    return sorted(out)


def _running_sum(spark: Any, tmp: Path, sidecar: ServerProcess) -> Any:
    events = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp / "input"))
    )
    return transform_with_state(
        events.groupBy("k"),
        processor=RunningSum(),
        output_schema="k string, n long, s long",
        use_pandas=False,
        parallelism=2,
        max_parallelism=16,
        dstl_address=sidecar.address,
        state_dir=str(tmp / "state"),
    )


def test_the_memory_sink_is_a_view_of_the_users_session_during_and_after_the_query(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    _write_batches(tmp_path / "input", COUNT_BATCHES)
    name = "dstl_memory_view"
    q = (
        _running_sum(spark, tmp_path, sidecar)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        # as Spark's memory sink: readable as soon as the query started, with its schema
        assert spark.table(name).columns == ["k", "n", "s"]
        q.wait_for_batch(len(COUNT_BATCHES) - 1, timeout_s=180)
        during = sorted(tuple(r) for r in spark.sql(f"select * from {name}").collect())
        assert during == _model(COUNT_BATCHES)
        assert spark.sql(f"select sum(n) from {name}").collect()[0][0] == sum(
            n for _, n, _ in _model(COUNT_BATCHES)
        )
    finally:
        q.stop()
    after = sorted(tuple(r) for r in spark.table(name).collect())
    assert after == _model(COUNT_BATCHES)
