"""Chaining: an event-time processor whose output timestamp feeds a windowed aggregation.

Runs on one machine in under a minute (Java 17 and ``pip install 'dstl[spark]'``)::

    python examples/processor_chained.py

Spark's pattern for ``transformWithState`` with ``eventTimeColumnName``, on dstl:

1. ``Sessions`` (per user, event time): a session ends ``GAP_MS`` after its
   last click (an event-time timer); it then emits ``(user, session_start,
   session_end, clicks)``. ``session_end`` is the stage's
   ``output_event_time_column`` (Spark's ``eventTimeColumnName``): the event
   time of the next stage, with the query's watermark.
2. A stateless step adds each session's 10-second window (``withColumn``).
3. ``SessionsPerWindow`` (per window, event time): sessions and clicks per
   window, emitted once the watermark passes the window's end, as Spark's
   ``groupBy(window("session_end", "10 seconds")).agg(...)`` in append mode.

Both stages run in one streaming query, each with its own state on dstl and
a checkpoint per micro-batch; the output goes to the memory sink, a view of
this Spark session. The script starts a ``dstl-server`` sidecar on
``file://`` storage in a temporary directory, writes six small input files
(one micro-batch each), prints the windows and stops everything.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from dstl_client.processor import StatefulProcessor, transform_with_state
from dstl_server.testing import ServerProcess

#: a session ends this long (event time) after its last click
GAP_MS = 3_000
#: the watermark trails the largest event time seen by this much
DELAY = "2 seconds"
#: tumbling windows of the session ends
WINDOW_MS = 10_000

#: one input file per micro-batch: (user, seconds after 2024-01-01T00:00:00Z)
CLICKS = [
    [("ada", 0), ("ada", 2), ("bob", 1), ("cy", 4)],
    [("dan", 6), ("eve", 7), ("ada", 9)],
    [("fay", 14), ("bob", 12), ("gus", 13)],
    [("hal", 21), ("cy", 20), ("ivy", 24)],
    [("jon", 33), ("kim", 35)],
    [("zed", 60)],
]

SESSION_SCHEMA = "user string, session_start timestamp, session_end timestamp, clicks long"
WINDOW_SCHEMA = "window_start timestamp, window_end timestamp, sessions long, clicks long"


def _ms(value: Any) -> int:
    """A pandas timestamp (naive, UTC here) in ms since the epoch."""
    return int(pd.Timestamp(value).value // 1_000_000)


def _ts(ms: int) -> pd.Timestamp:
    return pd.Timestamp(ms, unit="ms")


class Sessions(StatefulProcessor):
    """Clicks per user session; a session ends ``GAP_MS`` of event time after its last click."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", "start long, last long, clicks long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:
        start, last, clicks = self.session.get() if self.session.exists() else (None, None, 0)
        for pdf in rows:
            times = [_ms(t) for t in pdf["ts"]]
            start = min(times) if start is None else min(start, *times)
            last = max(times) if last is None else max(last, *times)
            clicks += len(pdf)
        assert start is not None and last is not None
        for old in self.handle.listTimers():
            self.handle.deleteTimer(old)
        self.handle.registerTimer(last + GAP_MS)
        self.session.update((start, last, clicks))
        yield from ()

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
        start, _, clicks = self.session.get()
        self.session.clear()
        yield pd.DataFrame(
            {
                "user": [key[0]],
                "session_start": [_ts(start)],
                "session_end": [_ts(expiredTimerInfo.getExpiryTimeInMs())],
                "clicks": [clicks],
            }
        )


class SessionsPerWindow(StatefulProcessor):
    """Per window (its start in ms): sessions and clicks, emitted when the watermark passes its end."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.totals = handle.getValueState("totals", "sessions long, clicks long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:
        sessions, clicks = self.totals.get() if self.totals.exists() else (0, 0)
        if not self.totals.exists():
            self.handle.registerTimer(int(key[0]) + WINDOW_MS)
        for pdf in rows:
            sessions += len(pdf)
            clicks += int(pdf["clicks"].sum())
        self.totals.update((sessions, clicks))
        yield from ()

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
        sessions, clicks = self.totals.get()
        self.totals.clear()
        start = int(key[0])
        yield pd.DataFrame(
            {
                "window_start": [_ts(start)],
                "window_end": [_ts(start + WINDOW_MS)],
                "sessions": [sessions],
                "clicks": [clicks],
            }
        )


def session_windows(clicks: Any, *, dstl_address: str, state_dir: str) -> Any:
    """The two stages over the stream ``clicks`` (``user string, ts timestamp``)."""
    from pyspark.sql import functions as F

    sessions = transform_with_state(
        clicks.groupBy("user"),
        processor=Sessions(),
        output_schema=SESSION_SCHEMA,
        output_mode="Append",
        time_mode="EventTime",
        event_time_column="ts",
        watermark_delay=DELAY,
        output_event_time_column="session_end",  # Spark's eventTimeColumnName
        parallelism=2,
        dstl_address=dstl_address,
        state_dir=state_dir,
    )
    window = F.expr(f"unix_millis(session_end) div {WINDOW_MS} * {WINDOW_MS}")
    return transform_with_state(
        sessions.withColumn("window", window).groupBy("window"),
        processor=SessionsPerWindow(),
        output_schema=WINDOW_SCHEMA,
        output_mode="Append",
        time_mode="EventTime",  # event time: session_end, the query's watermark
        parallelism=1,
    )


def write_clicks(directory: Path) -> None:
    directory.mkdir(parents=True)
    base = 1_700_000_000
    for i, batch in enumerate(CLICKS):
        lines = [
            json.dumps({"user": u, "ts": f"2024-01-01T00:{s // 60:02d}:{s % 60:02d}Z"})
            for u, s in batch
        ]
        path = directory / f"clicks-{i}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (base + i, base + i))  # the file source reads oldest first


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # this demo binds loopback only
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="dstl-chained-") as tmp:
        work = Path(tmp)
        write_clicks(work / "in")
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
                query = (
                    session_windows(
                        clicks, dstl_address=sidecar.address, state_dir=str(work / "state")
                    )
                    .writeStream.format("memory")
                    .queryName("session_windows")
                    .option("checkpointLocation", str(work / "checkpoint"))
                    .start()
                )
                try:
                    query.wait_for_batch(len(CLICKS) - 1, timeout_s=180)
                finally:
                    query.stop()
                rows = spark.sql("select * from session_windows order by window_start").collect()
                print(f"{len(CLICKS)} micro-batches, two stages, each batch a checkpoint on dstl:")
                for r in rows:
                    print(
                        f"  {r.window_start:%H:%M:%S} {r.window_end:%H:%M:%S} "
                        f"{r.sessions} {r.clicks}"
                    )
            finally:
                spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
