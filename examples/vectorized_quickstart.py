"""Quick start, vectorized: the clicks-per-user job of the processor quick start, as tables.

Runs on one machine in about a minute (Java 17 and ``pip install 'dstl[spark]'``)::

    python examples/vectorized_quickstart.py

The same input, the same output as ``examples/processor_quickstart.py``; the
difference is how the logic is written. A ``StatefulProcessor`` is called once
per user; ``clicks_per_user`` below is called once per task and micro-batch,
with every row of the batch, the state of every user in it and the due timers
as Arrow tables, and answers with tables: no Python call per user.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.vectorized import BatchInput, BatchOutput, transform_batches
from dstl_server.testing import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processor_quickstart import IDLE_MS, run  # the same input, sidecar and Spark


def clicks_per_user(batch: BatchInput) -> BatchOutput:
    """Counts clicks per user; emits ``idle`` once the watermark passes last click + 30 s."""
    at = pc.divide(pc.cast(batch.rows["ts"], pa.int64()), 1000)  # microseconds -> ms
    seen = (
        pa.table({"user": batch.rows["user"], "at": at})
        .group_by("user")
        .aggregate([("at", "count"), ("at", "max")])
        .join(batch.state, "user", join_type="left outer")
    )
    n = pc.add(seen["at_count"], pc.fill_null(seen["n"], 0))
    last = pc.max_element_wise(seen["at_max"], seen["last"], skip_nulls=True)
    state = pa.table({"user": seen["user"], "n": n, "last": last})
    clicks = pa.table({"user": seen["user"], "event": pa.repeat("clicks", len(seen)), "count": n})
    # a user with clicks in this batch is not idle: the old timer goes, a new one comes
    old = seen.filter(pc.field("present"))
    idle = batch.expired.join(batch.state, "user").filter(
        pc.invert(pc.is_in(pc.field("user"), value_set=seen["user"]))
    )
    idle_rows = pa.table(
        {"user": idle["user"], "event": pa.repeat("idle", len(idle)), "count": idle["n"]}
    )
    return BatchOutput(
        output=pa.concat_tables([clicks, idle_rows]),
        upserts=state,
        deletes=idle.select(["user"]),
        timers=pa.table({"user": state["user"], "timestamp_ms": pc.add(last, IDLE_MS)}),
        timer_deletes=pa.table({"user": old["user"], "timestamp_ms": pc.add(old["last"], IDLE_MS)}),
    )


def start(clicks: Any, sidecar: ServerProcess, work: Path) -> Any:
    """The streaming query of ``clicks_per_user`` over ``clicks``, its output in ``work/out``."""
    return (
        transform_batches(
            clicks,
            key="user",
            fn=clicks_per_user,
            state_schema="n long, last long",
            output_schema="user string, event string, count long",
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


if __name__ == "__main__":
    sys.exit(run(start))  # the processor quick start's run, this query
