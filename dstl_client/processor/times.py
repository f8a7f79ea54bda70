"""The times of a batch: processing time, event-time watermark, lateness bound.

They follow Spark's rules and come from Spark itself. The input stream gets
``withWatermark(event_time_column, delay)``; Spark's driver computes, after
each batch, ``watermark = max(previous, max event time of the batch - delay)``
(:func:`next_watermark`) and writes it, with the batch timestamp, into the
offsets log entry of the *next* batch before that batch runs. The driver
reads that entry (:func:`read_offsets_entry`) and carries a
:class:`BatchTimes` to the batch's tasks, so a batch re-run after a crash
sees exactly the same times, and the watermark is recovered with Spark's
own checkpoint.

Timers of batch ``N`` fire at the watermark of batch ``N`` (event time) or
its batch timestamp (processing time), after the batch's input rows. Input
rows are late when their event time is at or before the watermark of batch
``N - 1`` (the watermark of batch ``N`` in batch 0): Spark's "watermark for
late events" of stateful operators (since Spark 3.4), while timers and
eviction use the current one. So with a backlog (input already there, no
batch without data in between) a row between the two watermarks is still
processed, as Spark's ``transformWithState`` does; after a batch without
data (which a ``foreachBatch`` query never runs) the two are equal.

Immutable values and pure functions (the reader runs on the driver's batch thread).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dstl_client.batch.query import source_progress
from dstl_client.core.durations import parse_duration
from dstl_client.core.errors import DstlError, InvalidArgument
from dstl_client.processor.api import TimerValues

NO_TIME = -1


def parse_duration_ms(text: str) -> int:
    """A Spark interval string (``"10 seconds"``, ``"1 minute 30 seconds"``, ``"500 ms"``) in
    whole ms; a unit is required (:mod:`dstl_client.core.durations`)."""
    return int(parse_duration(text).ms)


def next_watermark(previous_ms: int, batch_max_event_ms: int | None, delay_ms: int) -> int:
    """Spark's watermark after a batch: it only moves forward, ``delay_ms`` behind the
    largest event time seen; a batch without event times leaves it as it was."""
    if batch_max_event_ms is None:
        return previous_ms
    return max(previous_ms, batch_max_event_ms - delay_ms)


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """The times of one batch, fixed by the driver before its tasks run.

    Invariant: the same for every run of the batch (read from Spark's offsets
    log). Frozen: any thread.
    """

    #: the batch's processing time (Spark's batch timestamp), ms
    processing_ms: int = NO_TIME
    #: the batch's watermark, ms: event-time timers fire at it; ``0`` before any event
    #: time and in a query without one (Spark's ``batchWatermarkMs``); ``-1``: not read
    watermark_ms: int = NO_TIME
    #: input rows with an event time at or before it are late (``-1``: none are)
    late_watermark_ms: int = NO_TIME

    def timer_values(self, time_mode: str) -> TimerValues:
        """What ``handle*`` calls see, as in Spark 4.3: ``-1`` for both in time mode
        ``"None"``; else the batch's timestamp and watermark, which is ``0`` in a query
        without event time (time mode ProcessingTime) and before the first watermark."""
        if time_mode == "None":
            return TimerValues(NO_TIME, NO_TIME)
        return TimerValues(self.processing_ms, self.watermark_ms)

    def timers_due_at(self, time_mode: str) -> int | None:
        """Timers at or before this time fire in the batch (``None``: no timers in this mode)."""
        if time_mode == "ProcessingTime":
            return self.processing_ms
        if time_mode == "EventTime":
            return self.watermark_ms
        return None


def _metadata(entry: Sequence[Any] | None) -> dict[str, Any]:
    """The metadata line of an offsets log entry (``v1``, then a JSON object)."""
    if not entry:
        return {}
    for line in entry[1:2]:
        if isinstance(line, dict):
            return line
        if isinstance(line, str):
            try:
                doc = json.loads(line)
            except ValueError:
                return {}
            return doc if isinstance(doc, dict) else {}
    return {}


def times_from_offsets(
    entry: Sequence[Any] | None,
    *,
    event_time: bool,
    previous: Sequence[Any] | None = None,
) -> BatchTimes:
    """The times of a batch from its offsets log entry (and the previous batch's).

    ``batchTimestampMs`` is the processing time and ``batchWatermarkMs`` the
    watermark (``0`` before any event time and in a query without one, as in
    Spark, whose ``TimerValues`` give it in time mode ProcessingTime too);
    with ``event_time``, ``previous``'s watermark is the lateness bound (this
    entry's if there is no previous one, as in Spark's first batch).
    """
    meta = _metadata(entry)
    if "batchTimestampMs" not in meta:
        raise InvalidArgument("the offsets log entry of the batch has no batch timestamp")
    processing = int(meta["batchTimestampMs"])
    watermark = int(meta.get("batchWatermarkMs", 0))
    if not event_time:
        return BatchTimes(processing_ms=processing, watermark_ms=watermark)
    before = _metadata(previous)
    late = int(before["batchWatermarkMs"]) if "batchWatermarkMs" in before else watermark
    return BatchTimes(processing_ms=processing, watermark_ms=watermark, late_watermark_ms=late)


def batch_times(
    spark_checkpoint: str, batch_id: int, session: Any, *, event_time: bool
) -> BatchTimes:
    """The times of ``batch_id`` from Spark's offsets log under ``spark_checkpoint``.

    Reads the batch's entry and, with ``event_time``, the previous batch's
    (the lateness bound). Raises :class:`~dstl_client.core.errors.DstlError`
    when the batch has no entry. The driver's batch thread.
    """
    entry = read_offsets_entry(spark_checkpoint, batch_id, session)
    if entry is None:
        raise DstlError(
            f"no offsets log entry of batch {batch_id} under {spark_checkpoint}: "
            "the batch's times cannot be known"
        )
    previous = read_offsets_entry(spark_checkpoint, batch_id - 1, session) if event_time else None
    return times_from_offsets(entry, event_time=event_time, previous=previous)


def read_offsets_entry(spark_checkpoint: str, batch_id: int, session: Any) -> list[Any] | None:
    """Lines of Spark's offsets log entry of ``batch_id`` (``None`` if there is none).

    A local checkpoint is read directly; any other file system (``s3a://``,
    ``hdfs://``) through Spark's reader (one small job).
    """
    if batch_id < 0:
        return None
    entry = source_progress(spark_checkpoint, batch_id)
    if entry is not None:
        return list(entry)
    location = f"{str(spark_checkpoint).rstrip('/')}/offsets/{batch_id}"
    if "://" not in location or location.startswith("file:"):
        return None
    try:
        rows = session.read.text(location).collect()
    except Exception:  # no such entry (or unreadable): the caller decides
        return None
    return [r[0] for r in rows] or None
