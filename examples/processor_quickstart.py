"""Quick start: a Spark ``StatefulProcessor`` with an event-time timer, its state on dstl.

Runs on one machine in about a minute (Java 17 and ``pip install 'dstl[spark]'``)::

    python examples/processor_quickstart.py

It starts a ``dstl-server`` sidecar on ``file://`` storage in a temporary
directory, writes three small input files of click events, runs the processor
over them (one micro-batch per file, each one a checkpoint), prints the rows
it emitted and stops everything. The processor is written exactly as for
Spark's ``transformWithStateInPandas``; only its import and the call that
starts it differ.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from dstl_client.processor import StatefulProcessor, transform_with_state
from dstl_server.testing import ServerProcess

#: a user whose last click is 30 s of event time old is reported idle
IDLE_MS = 30_000

#: one input file per micro-batch: (user, seconds after 2024-01-01T00:00:00Z)
CLICKS = [
    [("ada", 0), ("ada", 5), ("bob", 3)],
    [("ada", 40), ("cy", 45)],
    [("cy", 90), ("dan", 95)],  # bob's timer (3 s + 30 s) is due now
]


class ClicksPerUser(StatefulProcessor):
    """Counts clicks per user; emits ``idle`` once the watermark passes last click + 30 s."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.last = handle.getValueState("last", "at long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:
        n = self.count.get()[0] if self.count.exists() else 0
        last = self.last.get()[0] if self.last.exists() else None
        for pdf in rows:
            n += len(pdf)
            newest = int(pdf["ts"].max().timestamp() * 1000)
            last = newest if last is None else max(last, newest)
        assert last is not None
        for old in self.handle.listTimers():
            self.handle.deleteTimer(old)
        self.handle.registerTimer(last + IDLE_MS)
        self.count.update((n,))
        self.last.update((last,))
        yield pd.DataFrame({"user": [key[0]], "event": ["clicks"], "count": [n]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
        n = self.count.get()[0]
        self.count.clear()
        self.last.clear()
        yield pd.DataFrame({"user": [key[0]], "event": ["idle"], "count": [n]})


def write_clicks(directory: Path) -> None:
    """One file per micro-batch; Spark's file source reads them oldest first."""
    directory.mkdir(parents=True)
    oldest = time.time() - 100
    for i, batch in enumerate(CLICKS):
        lines = [
            json.dumps({"user": u, "ts": f"2024-01-01T00:{s // 60:02d}:{s % 60:02d}Z"})
            for u, s in batch
        ]
        path = directory / f"clicks-{i}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (oldest + i, oldest + i))  # distinct times: a fixed batch order


def start(clicks: Any, sidecar: ServerProcess, work: Path) -> Any:
    """The streaming query of the processor over ``clicks``, its output in ``work/out``."""
    query = (
        transform_with_state(
            clicks.groupBy("user"),
            processor=ClicksPerUser(),
            output_schema="user string, event string, count long",
            output_mode="Update",
            time_mode="EventTime",
            event_time_column="ts",
            watermark_delay="10 seconds",
            parallelism=2,
            dstl_address=sidecar.address,
            state_dir=str(work / "state"),
        )
        .writeStream.format("parquet")
        .option("checkpointLocation", str(work / "checkpoint"))
        .start(str(work / "out"))
    )
    return query


def run(start_query: Callable[[Any, ServerProcess, Path], Any]) -> int:
    """Start a sidecar and Spark, run the query ``start_query`` builds over the clicks
    (one micro-batch per file), print its output and stop everything."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # this demo binds loopback only
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="dstl-quickstart-") as tmp:
        work = Path(tmp)
        write_clicks(work / "in")
        # the per-node sidecar (in production: the Helm DaemonSet); here a local process
        with ServerProcess(work / "sidecar") as sidecar:
            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.sql.session.timeZone", "UTC")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            try:
                clicks = (
                    spark.readStream.schema("user string, ts timestamp")
                    .option("maxFilesPerTrigger", 1)
                    .json(str(work / "in"))
                )
                query = start_query(clicks, sidecar, work)
                try:
                    query.wait_for_batch(len(CLICKS) - 1, timeout_s=180)
                finally:
                    query.stop()
                rows = (
                    spark.read.parquet(str(work / "out"))
                    .orderBy("user", "event", "count")
                    .collect()
                )
                print(f"{len(CLICKS)} micro-batches, each one a checkpoint on dstl; output:")
                for r in rows:
                    print(f"  {r.user:<4} {r.event:<7} {r['count']}")
            finally:
                spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(run(start))
