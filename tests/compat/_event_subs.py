"""Sub-processors in time mode EventTime: event-time timers, the watermark, late rows.

Input rows ``(k, b, ts, at)``: ``at`` is ``ts`` in ms (the processors use it,
so no time zone is involved), watermark delay :data:`DELAY`. Outputs hold
times relative to :data:`T0_MS`. The batches are laid out so that no timer
is due after the last batch's input (Spark would fire it in a batch without
data, dstl with the next input) and only the ``late`` sub-processor has a row
between two batches' watermarks (issue 22 item 7).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from tests.compat._multiplex import Sub

INPUT_SCHEMA = "k string, b long, ts timestamp, at long"
DELAY = "10 seconds"
T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
T0_MS = int(T0.timestamp() * 1000)


def _rel(ms: int) -> int:
    """A time in ms relative to :data:`T0_MS` (``-1``, "none", stays as is)."""
    return ms if ms <= 0 else ms - T0_MS


class EventTimers(Sub):
    """``registerTimer`` at the key's latest event + 5 s, the earlier one deleted; the
    watermark in ``TimerValues``; ``handleExpiredTimer`` for keys with and without input."""

    name = "event"

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.latest = handle.getValueState("event_latest", "at long")

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        h = self.handle
        before = [_rel(t) for t in h.listTimers()]
        latest = max(r["at"] for r in records)
        for t in before:
            h.deleteTimer(t + T0_MS)
        h.registerTimer(latest + 5_000)
        self.latest.update((latest,))
        return [
            (
                "input",
                _rel(timerValues.getCurrentWatermarkInMs()),
                timerValues.getCurrentProcessingTimeInMs() > 0,
                before,
                [_rel(t) for t in h.listTimers()],
                sorted(_rel(r["at"]) for r in records),
            )
        ]

    def timer(self, key: str, timerValues: Any, expiredTimerInfo: Any) -> Sequence[Any]:
        latest = self.latest.get()
        self.latest.clear()
        return [
            (
                "fired",
                _rel(expiredTimerInfo.getExpiryTimeInMs()),
                _rel(timerValues.getCurrentWatermarkInMs()),
                None if latest is None else _rel(latest[0]),
                list(self.handle.listTimers()),
            )
        ]


class LateRows(Sub):
    """Which rows reach the processor: on time, late in both engines' rules, and one row
    between the previous batch's watermark and this batch's (Spark keeps it)."""

    name = "late"

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        return [("seen", sorted(_rel(r["at"]) for r in records))]


SUBS: tuple[type[Sub], ...] = (EventTimers, LateRows)

#: per batch: (key, seconds after T0). Watermarks: batch 0 none, 1: 10 s, 2: 21 s
_SCRIPT: list[list[tuple[str, int]]] = [
    [("event:a", 10), ("event:b", 12), ("late:on", 20)],
    [("event:a", 30), ("event:c", 31), ("late:on", 25)],
    [("event:d", 40), ("event:a", 1), ("late:gone", 5), ("late:between", 15), ("late:on", 33)],
]


def batches() -> list[list[tuple[Any, ...]]]:
    return [
        [(k, b, T0 + datetime.timedelta(seconds=s), T0_MS + s * 1000) for k, s in rows]
        for b, rows in enumerate(_SCRIPT)
    ]


class TimestampOut(Sub):
    """A processor that emits event times: ``timestamp`` and ``timestamp_ntz`` output columns."""

    name = "tsout"
    columns = ("k", "sub", "ts", "ntz", "n")

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        latest = max(records, key=lambda r: r["at"])
        ntz = datetime.datetime(2024, 1, 1) + datetime.timedelta(milliseconds=latest["at"] - T0_MS)
        return [{"ts": latest["ts"], "ntz": ntz, "n": len(records)}]


TS_OUTPUT_SCHEMA = "k string, sub string, ts timestamp, ntz timestamp_ntz, n long"
TS_BATCHES: list[list[tuple[Any, ...]]] = [
    [
        ("tsout:a", 0, T0 + datetime.timedelta(seconds=3), T0_MS + 3000),
        ("tsout:a", 0, T0 + datetime.timedelta(seconds=9), T0_MS + 9000),
    ]
]
