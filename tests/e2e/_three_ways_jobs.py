"""The jobs of issue 20's three-way test, each written for every engine: as a
``StatefulProcessor`` (Spark's own base class: Spark's ``transformWithStateInPandas`` and
dstl's ``transform_with_state`` run the same class) and as one vectorized function for
dstl's ``transform_batches``, with its input rows per micro-batch.

* :data:`COUNT_SUM` (the contract's reference job): per key ``k``, ``count += rows``,
  ``total += sum(v)``; the key's new ``(k, count, total)`` is output (Update mode).
* :data:`IDLE` (event time, timers): the same count and sum, and an event-time timer
  ``IDLE_MS`` after the key's latest event of its last batch; when the watermark
  passes it, the key's totals are output as ``idle`` and its state is removed.

Plain values and functions: the processors and functions run on Spark's executors.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkStatefulProcessor

from dstl_client.vectorized import BatchFunction, BatchInput, BatchOutput

#: the output rows per batch id, as tuples in the output schema's order
Outputs = dict[int, set[tuple[Any, ...]]]


@dataclass(frozen=True)
class Job:
    """One job, written for each engine, and its input. Frozen."""

    name: str
    #: the input (DDL for Spark, Arrow for the files) and its rows per batch
    input_schema: str
    input_arrow: pa.Schema
    batches: list[list[tuple[Any, ...]]]
    #: the class of its ``StatefulProcessor`` (Spark's and ``transform_with_state``)
    processor: Callable[[], Any]
    #: its vectorized function, state and output
    fn: BatchFunction
    state_schema: str
    output_schema: str
    time_mode: str = "None"
    #: ``(event-time column, watermark delay)``
    watermark: tuple[str, str] | None = None


# --- count and sum per key -------------------------------------------------------------

SUMS_STATE = "count long, total long"
SUMS_OUTPUT = "k long, count long, total long"
ROWS = 120


def batch_rows(batch: int) -> list[tuple[Any, ...]]:
    """Batch ``batch``'s input rows ``(k, v)``: repeated keys, keys new in later batches."""
    rng = random.Random(20 + batch)
    return [(rng.randrange(30 + 6 * batch), rng.randrange(-50, 100)) for _ in range(ROWS)]


class CountSum(SparkStatefulProcessor):  # type: ignore[misc]
    """Count and sum of ``v`` per key in one value state; one output row per key and batch."""

    def init(self, handle: Any) -> None:
        self.agg = handle.getValueState("agg", SUMS_STATE)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        count, total = self.agg.get() if self.agg.exists() else (0, 0)
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["v"].sum())
        self.agg.update((count, total))
        yield pd.DataFrame({"k": [int(key[0])], "count": [count], "total": [total]})

    def close(self) -> None:
        pass


def count_sum(batch: BatchInput) -> BatchOutput:
    """The job as one vectorized step per key-group range: aggregate the batch per key,
    add the state (absent: zero), output and upsert the new ``(count, total)``."""
    per_key = batch.rows.group_by("k").aggregate([("v", "count"), ("v", "sum")])
    joined = per_key.join(batch.state, "k", join_type="left outer")
    new = pa.table(
        {
            "k": joined["k"],
            "count": pc.add(pc.coalesce(joined["count"], 0), joined["v_count"]),
            "total": pc.add(pc.coalesce(joined["total"], 0), joined["v_sum"]),
        }
    )
    return BatchOutput(output=new, upserts=new)


COUNT_SUM = Job(
    name="count_sum",
    input_schema="k long, v long",
    input_arrow=pa.schema([("k", pa.int64()), ("v", pa.int64())]),
    batches=[batch_rows(b) for b in range(4)],
    processor=CountSum,
    fn=count_sum,
    state_schema=SUMS_STATE,
    output_schema=SUMS_OUTPUT,
)


def expected_sums(batches: int = len(COUNT_SUM.batches)) -> Outputs:
    """What :data:`COUNT_SUM` outputs for its first ``batches`` batches, folded here."""
    state: dict[int, tuple[int, int]] = {}
    out: Outputs = {}
    for b in range(batches):
        touched = set()
        for k, v in COUNT_SUM.batches[b]:
            count, total = state.get(k, (0, 0))
            state[k] = (count + 1, total + v)
            touched.add(k)
        out[b] = {(k, *state[k]) for k in touched}
    return out


# --- idle keys: event time and timers --------------------------------------------------

IDLE_MS = 30_000
IDLE_STATE = "count long, total long, timer long"
IDLE_OUTPUT = "k long, kind string, count long, total long, at long"
T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
T0_MS = int(T0.timestamp() * 1000)


def idle_row(k: int, seconds: int, v: int) -> tuple[Any, ...]:
    """An input row ``(k, v, ts, at)``: ``at`` is ``ts`` in ms (no time zone involved)."""
    return (k, v, T0 + datetime.timedelta(seconds=seconds), T0_MS + seconds * 1000)


#: watermark delay 10 s: batch N's watermark is the latest event before it, less 10 s
IDLE_BATCHES = [
    [idle_row(1, 0, 4), idle_row(1, 5, 6), idle_row(2, 3, 1), idle_row(3, 20, 9)],
    [idle_row(1, 40, 2), idle_row(2, 2, 7), idle_row(4, 45, 3)],
    # watermark 35 s: key 2's timer (32 s) fires, without input
    [idle_row(3, 60, 5), idle_row(5, 55, 8), idle_row(7, 90, 1)],
    # watermark 80 s: 1@30 is late (at or before batch 2's watermark); 1 and 4 fire;
    # 2 starts over
    [idle_row(2, 95, 3), idle_row(8, 81, 2), idle_row(1, 30, 9)],
]


class IdleCountSum(SparkStatefulProcessor):  # type: ignore[misc]
    """Count and sum per key; ``idle`` and cleared ``IDLE_MS`` after the key's latest event."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.agg = handle.getValueState("agg", IDLE_STATE)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        count, total, timer = self.agg.get() if self.agg.exists() else (0, 0, None)
        latest = 0
        for pdf in rows:
            count += len(pdf)
            total += int(pdf["v"].sum())
            latest = max(latest, int(pdf["at"].max()))
        if timer is not None:
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(latest + IDLE_MS)
        self.agg.update((count, total, latest + IDLE_MS))
        yield pd.DataFrame(
            {
                "k": [int(key[0])],
                "kind": ["update"],
                "count": [count],
                "total": [total],
                "at": [latest],
            }
        )

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
        import pandas as pd

        count, total, _ = self.agg.get()
        self.agg.clear()
        yield pd.DataFrame(
            {
                "k": [int(key[0])],
                "kind": ["idle"],
                "count": [count],
                "total": [total],
                "at": [expiredTimerInfo.getExpiryTimeInMs()],
            }
        )

    def close(self) -> None:
        pass


def idle_count_sum(batch: BatchInput) -> BatchOutput:
    """:class:`IdleCountSum` as one vectorized step: keys with input are updated (their
    old timer deleted, a new one registered); due timers of keys without input fire."""
    per_key = batch.rows.group_by("k").aggregate([("v", "count"), ("v", "sum"), ("at", "max")])
    joined = per_key.join(batch.state, "k", join_type="left outer")
    timer = pc.add(joined["at_max"], IDLE_MS)
    count = pc.add(pc.coalesce(joined["count"], 0), joined["v_count"])
    total = pc.add(pc.coalesce(joined["total"], 0), joined["v_sum"])
    updated = pa.table(
        {
            "k": joined["k"],
            "kind": pa.array(["update"] * len(joined), pa.string()),
            "count": count,
            "total": total,
            "at": joined["at_max"],
        }
    )
    # a key with input had its timer deleted in the processor's handleInputRows
    fired = batch.expired.join(per_key.select(["k"]), "k", join_type="left anti")
    fired = fired.join(batch.state, "k", join_type="left outer")
    idle = pa.table(
        {
            "k": fired["k"],
            "kind": pa.array(["idle"] * len(fired), pa.string()),
            "count": fired["count"],
            "total": fired["total"],
            "at": fired["timestamp_ms"],
        }
    )
    old = joined.filter(pc.is_valid(joined["timer"]))
    return BatchOutput(
        output=pa.concat_tables([updated, idle]),
        upserts=pa.table({"k": joined["k"], "count": count, "total": total, "timer": timer}),
        deletes=fired.select(["k"]),
        timers=pa.table({"k": joined["k"], "timestamp_ms": timer}),
        timer_deletes=pa.table({"k": old["k"], "timestamp_ms": old["timer"]}),
    )


IDLE = Job(
    name="idle",
    input_schema="k long, v long, ts timestamp, at long",
    input_arrow=pa.schema(
        [
            ("k", pa.int64()),
            ("v", pa.int64()),
            ("ts", pa.timestamp("us", "UTC")),
            ("at", pa.int64()),
        ]
    ),
    batches=IDLE_BATCHES,
    processor=IdleCountSum,
    fn=idle_count_sum,
    state_schema=IDLE_STATE,
    output_schema=IDLE_OUTPUT,
    time_mode="EventTime",
    watermark=("ts", "10 seconds"),
)
