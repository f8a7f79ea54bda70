"""Spark's ``StatefulProcessor`` on dstl in real PySpark jobs: Spark's own output, timers, TTL,
event time, a driver kill, the ``writeStream`` builder and the progress figures."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkStatefulProcessor

from dstl_client.processor import transform_with_state
from dstl_server.testing import ServerProcess
from tests.e2e._harness import run_driver
from tests.e2e._processor_job import T0_MS, expected, read_outputs, start, write_input

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
TOTALS_SCHEMA = "k string, n long, total long, last3 string, pages long, top string"
TOTALS_BATCHES = [
    [("a", 5, "p1"), ("b", 7, "p2"), ("a", 1, "p2"), ("c", 3, "p1")],
    [("a", 2, "p1"), ("b", 9, "p1"), ("d", 4, "p3"), ("a", 8, "p1")],
    [("c", 6, "p2"), ("a", 3, "p3"), ("d", 1, "p3"), ("b", 2, "p2"), ("b", 5, "p2")],
]


class Totals(SparkStatefulProcessor):  # type: ignore[misc]
    """Written for Spark's ``transformWithStateInPandas``, from Spark's own base class.

    Value state (count, sum; from an initial state in the first batch), list
    state (the last three values) and map state (visits per page), in time
    mode None; its output does not depend on the order of a key's rows
    within a batch.
    """

    def init(self, handle: Any) -> None:
        self.total = handle.getValueState("total", "n long, s long")
        self.values = handle.getListState("values", "v long")
        self.pages = handle.getMapState("pages", "page string", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        n, s = self.total.get() if self.total.exists() else (0, 0)
        batch = []
        for pdf in rows:
            for v, page in zip(pdf["v"], pdf["page"], strict=True):
                n, s = n + 1, s + int(v)
                batch.append(int(v))
                seen = self.pages.getValue((page,))
                self.pages.updateValue((page,), ((seen[0] if seen else 0) + 1,))
        self.values.appendList([(v,) for v in sorted(batch)])
        last3 = [v for (v,) in self.values.get()][-3:]
        self.values.put([(v,) for v in last3])
        self.total.update((n, s))
        top = max(self.pages.iterator(), key=lambda kv: (kv[1][0], kv[0][0]))[0][0]
        yield pd.DataFrame(
            {
                "k": [key[0]],
                "n": [n],
                "total": [s],
                "last3": [",".join(map(str, last3))],
                "pages": [len(list(self.pages.keys()))],
                "top": [top],
            }
        )

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        for n, s in zip(initialState["n"], initialState["s"], strict=True):
            self.total.update((int(n), int(s)))

    def close(self) -> None:
        pass


def _write_totals(directory: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    base = time.time() - 1000
    for b, rows in enumerate(TOTALS_BATCHES):
        table = pa.table(
            {
                "k": [k for k, _, _ in rows],
                "v": pa.array([v for _, v, _ in rows], pa.int64()),
                "page": [p for _, _, p in rows],
            }
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


def test_a_spark_processor_gives_sparks_own_output_batch_by_batch(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    _write_totals(tmp_path / "input")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)

    def events() -> Any:
        return (
            spark.readStream.schema("k string, v long, page string")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / "input"))
        )

    def collect(into: dict[int, list[tuple[Any, ...]]]) -> Any:
        def sink(df: Any, batch_id: int) -> None:
            into[batch_id] = sorted(tuple(r) for r in df.collect())

        return sink

    # "a" starts from an initial count and sum; "z" has an initial state and no input
    initial = spark.createDataFrame([("a", 10, 100), ("z", 1, 1)], "k string, n long, s long")
    by_spark: dict[int, list[tuple[Any, ...]]] = {}
    q = (
        events()
        .groupBy("k")
        .transformWithStateInPandas(
            Totals(), TOTALS_SCHEMA, "Update", "None", initialState=initial.groupBy("k")
        )
        .writeStream.foreachBatch(collect(by_spark))
        .option("checkpointLocation", str(tmp_path / "spark-ckpt"))
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(240)
    by_dstl: dict[int, list[tuple[Any, ...]]] = {}
    dq = (
        transform_with_state(
            events().groupBy("k"),
            processor=Totals(),
            output_schema=TOTALS_SCHEMA,
            output_mode="Update",
            time_mode="None",
            initial_state=initial.groupBy("k"),
            parallelism=2,
            max_parallelism=16,
            dstl_address=sidecar.address,
            state_dir=str(tmp_path / "state"),
        )
        .writeStream.foreachBatch(collect(by_dstl))
        .option("checkpointLocation", str(tmp_path / "dstl-ckpt"))
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )
    try:
        dq.await_termination(240)
    finally:
        dq.stop()
    assert len(by_spark) == len(TOTALS_BATCHES)
    assert by_dstl == by_spark
    assert by_dstl[2][0] == ("a", 15, 119, "2,8,3", 3, "p1")


def test_event_time_timers_ttl_and_a_driver_kill_give_the_failure_free_output(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    write_input(tmp_path / "input")
    paths = {
        "checkpoint-dir": tmp_path / "ckpt",
        "address": sidecar.address,
        "input-dir": tmp_path / "input",
        "out-dir": tmp_path / "out",
    }
    # a driver dies by SIGKILL after batch 2's tasks ran (timers fired, output written to the
    # sink), before its checkpoint
    status = run_driver(
        "tests.e2e._processor_job",
        {**paths, "state-dir": tmp_path / "node-a", "until-batch": 3, "crash": "tasks_done:2"},
    )
    assert status == -signal.SIGKILL
    assert sorted(read_outputs(tmp_path / "out")) == [0, 1, 2]
    # another driver (this one) on another node (empty state directory) resumes: it runs
    # batch 2 again from the checkpoint of batch 1, then batch 3
    q = start(
        spark,
        checkpoint_dir=tmp_path / "ckpt",
        input_dir=tmp_path / "input",
        out_dir=tmp_path / "out",
        address=sidecar.address,
        state_dir=tmp_path / "node-b",
    )
    try:
        q.wait_for_batch(3, timeout_s=180)
        deadline = time.monotonic() + 60
        while (q.lastProgress or {}).get("batchId") != 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        progress = q.lastProgress
    finally:
        q.stop()
    want, late = expected()
    got = read_outputs(tmp_path / "out")
    # every batch's output exactly once, as a failure-free run gives it
    assert {b: sorted(rows) for b, rows in got.items()} == {b: sorted(w) for b, w in want.items()}
    assert {r[0] for r in want[2] if r[1] == "idle"} == {"b"}  # a user without input
    assert {r[0] for r in want[3] if r[1] == "idle"} == {"a", "d"}
    restored = {h.batch_id: h.restored_subtasks for h in q.history}
    assert restored[2] == 2  # both subtasks rebuilt their key groups, timers and TTL included
    figures = {f.batch_id: f.processor for f in q.batch_figures}
    assert figures[2].timers_fired == 1 and figures[3].timers_fired == 2
    assert figures[3].late_rows_dropped == late[3] == 1
    assert figures[3].ttl_evicted > 0
    assert figures[3].output_rows == len(want[3])
    assert progress is not None and progress["batchId"] == 3
    dstl = progress["dstl"]
    assert dstl["timersFired"] == 2 and dstl["lateRowsDropped"] == 1
    assert dstl["checkpointDurationMs"] >= 0 and dstl["bytesPersisted"] > 0
    assert dstl["stateRows"] > 0
    assert dstl["watermarkMs"] == T0_MS + 80_000  # the latest event before batch 3, less 10 s
