"""The ``StatefulProcessor`` job of the end-to-end tests: its processor, input, expected output.

``IdleSessions`` keeps, per user, a count (value state), visits per page (map
state) and the visits of the current batch (a list state with a 1 ms TTL:
what earlier batches appended has expired), and an event-time timer
``IDLE_MS`` after the user's latest event: when the watermark passes it, the
user's state is output as ``idle`` and cleared. Input: ``user, ts, at, page``,
watermark delay ``DELAY``; the batches (:data:`BATCHES`) make timers fire
for users with and without input, and late rows.

Run as a script it is one driver process (killed by a test at a chosen point)::

    python -m tests.e2e._processor_job --checkpoint-dir ... --crash tasks_done:2
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dstl_client.processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from dstl_client.processor.times import next_watermark
from tests.e2e._harness import crash_at

OUTPUT_SCHEMA = "user string, kind string, count long, pages long, recent long, at long"
#: ``at`` is ``ts`` in ms (the processor's timers use it: no time zone involved)
INPUT_SCHEMA = "user string, ts timestamp, at long, page string"
DELAY = "10 seconds"
DELAY_MS = 10_000
IDLE_MS = 30_000
MAX_P = 16
T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
T0_MS = int(T0.timestamp() * 1000)

#: per batch: (user, seconds after T0, page)
BATCHES: list[list[tuple[str, int, str]]] = [
    [("a", 0, "p1"), ("a", 5, "p2"), ("b", 3, "p1"), ("c", 20, "p1")],
    # b@2 is on time: late rows are those at or before the previous batch's watermark (0)
    [("a", 40, "p1"), ("b", 2, "p2"), ("d", 45, "p1")],
    [("c", 60, "p2"), ("e", 55, "p1"), ("g", 90, "p1")],  # b's timer (32 s) fires
    # a@30 is late (batch 2's watermark: 35 s); a@79 would not be (watermark 80 s, as in
    # Spark under a backlog); a and d fire
    [("b", 95, "p1"), ("h", 81, "p2"), ("a", 30, "p1")],
]


class IdleSessions(StatefulProcessor):
    """Per user: count, pages, this batch's visits; ``idle`` once the watermark passes.

    ``Row``\\ s in and out (Spark's ``transformWithState`` style: ``use_pandas=False``).
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.pages = handle.getMapState("pages", "page string", "n long")
        self.recent = handle.getListState("recent", "ts timestamp", ttlDurationMs=1)
        self.timer = handle.getValueState("timer", "at long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        count = self.count.get()
        n = 0 if count is None else count[0]
        latest = None
        for row in rows:
            n += 1
            seen = self.pages.getValue((row.page,))
            self.pages.updateValue((row.page,), ((seen[0] if seen else 0) + 1,))
            self.recent.appendValue((row.ts,))
            latest = row.at if latest is None else max(latest, row.at)
        self.count.update((n,))
        assert latest is not None
        old = self.timer.get()
        if old is not None:
            self.handle.deleteTimer(old[0])
        self.handle.registerTimer(latest + IDLE_MS)
        self.timer.update((latest + IDLE_MS,))
        yield self._row(key[0], "update", latest)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        row = self._row(key[0], "idle", expiredTimerInfo.getExpiryTimeInMs())
        self.count.clear()
        self.pages.clear()
        self.recent.clear()
        self.timer.clear()
        yield row

    def _row(self, user: str, kind: str, at: int) -> Any:
        from pyspark.sql import Row

        return Row(
            user=user,
            kind=kind,
            count=(self.count.get() or (0,))[0],
            pages=len(list(self.pages.keys())),
            recent=len(list(self.recent.get())),
            at=at,
        )


Output = tuple[str, str, int, int, int, int]


def expected() -> tuple[dict[int, set[Output]], dict[int, int]]:
    """Every batch's output rows, and its late rows, as Spark's rules make them."""
    outputs: dict[int, set[Output]] = {}
    late: dict[int, int] = {}
    state: dict[str, dict[str, Any]] = {}
    watermark = previous = 0  # Spark's watermark before any event time
    for b, rows in enumerate(BATCHES):
        out: set[Output] = set()
        bound = watermark - T0_MS  # the batch's watermark, relative to T0: timers
        late_bound = previous - T0_MS  # the previous batch's: late rows (Spark's rule)
        on_time = [r for r in rows if r[1] * 1000 > late_bound]
        late[b] = len(rows) - len(on_time)
        for user in dict.fromkeys(u for u, _, _ in on_time):
            mine = [r for r in on_time if r[0] == user]
            s = state.setdefault(user, {"count": 0, "pages": {}, "latest": None})
            s["count"] += len(mine)
            for _, _, page in mine:
                s["pages"][page] = s["pages"].get(page, 0) + 1
            latest = max(t for _, t, _ in mine) * 1000
            s["latest"] = latest
            out.add((user, "update", s["count"], len(s["pages"]), len(mine), T0_MS + latest))
        due = sorted(
            (s["latest"] + IDLE_MS, u) for u, s in state.items() if s["latest"] + IDLE_MS <= bound
        )
        for at, user in due:
            s = state.pop(user)
            out.add((user, "idle", s["count"], len(s["pages"]), 0, T0_MS + at))
        outputs[b] = out
        batch_max = T0_MS + max(t for _, t, _ in rows) * 1000
        previous, watermark = watermark, next_watermark(watermark, batch_max, DELAY_MS)
    return outputs, late


def write_input(directory: Path) -> None:
    """One Parquet file per batch (the file source reads the oldest first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 1000
    for b, rows in enumerate(BATCHES):
        table = pa.table(
            {
                "user": [u for u, _, _ in rows],
                "ts": pa.array(
                    [T0 + datetime.timedelta(seconds=t) for _, t, _ in rows],
                    pa.timestamp("us", "UTC"),
                ),
                "at": pa.array([T0_MS + t * 1000 for _, t, _ in rows], pa.int64()),
                "page": [p for _, _, p in rows],
            }
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


def read_outputs(out_dir: Path) -> dict[int, list[Output]]:
    """The sink's rows per batch (the batch is in each file's name)."""
    import pyarrow.parquet as pq

    from dstl_client.processor.sinks import batch_file_prefix

    got: dict[int, list[Output]] = {}
    for path in sorted(out_dir.glob("part-b*.parquet")):
        batch = int(path.name[len("part-b") :].split("-", 1)[0])
        assert path.name.startswith(batch_file_prefix(batch))
        for r in pq.read_table(path).to_pylist():
            got.setdefault(batch, []).append(
                (r["user"], r["kind"], r["count"], r["pages"], r["recent"], r["at"])
            )
    return got


def start(
    spark: Any,
    *,
    checkpoint_dir: Path,
    input_dir: Path,
    out_dir: Path,
    address: str,
    state_dir: Path,
    on_phase: Any = None,
) -> Any:
    """The job's query (the same in every driver that runs it)."""
    from dstl_client.processor import transform_with_state

    events = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    stream = transform_with_state(
        events.groupBy("user"),
        processor=IdleSessions(),
        output_schema=OUTPUT_SCHEMA,
        output_mode="Update",
        time_mode="EventTime",
        use_pandas=False,
        event_time_column="ts",
        watermark_delay=DELAY,
        parallelism=2,
        max_parallelism=MAX_P,
        job_id="e2e-processor",
        dstl_address=address,
        state_dir=str(state_dir),
        orphan_grace_s=0,
        materialize_interval_s=0,
        on_phase=on_phase,
    )
    return (
        stream.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint_dir))
        .outputMode("update")
        .queryName("idle_sessions")
        .start(str(out_dir))
    )


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("checkpoint-dir", "address", "state-dir", "input-dir", "out-dir"):
        p.add_argument(f"--{name}", required=True, type=Path)
    p.add_argument("--until-batch", type=int, required=True)
    p.add_argument("--crash", default="", help="phase:batch -> SIGKILL the driver there")
    args = p.parse_args()
    from tests.e2e._spark_job import session

    spark = session()
    q = start(
        spark,
        checkpoint_dir=args.checkpoint_dir,
        input_dir=args.input_dir,
        out_dir=args.out_dir,
        address=str(args.address),
        state_dir=args.state_dir,
        on_phase=crash_at(args.crash),
    )
    try:
        q.wait_for_batch(args.until_batch, timeout_s=240)
    finally:
        q.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
