"""Sub-processors that call every method of Spark's state API (time mode ProcessingTime).

Input rows ``(k, b, v)``: ``b`` is the micro-batch (0, 1, 2), so a
sub-processor's script can differ per batch without reading the clock.
Processing times differ between two runs: outputs only hold times relative
to the batch's own (``timerValues``), or whether they are positive.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql.types import LongType, StringType, StructField, StructType

from tests.compat._multiplex import Sub

INPUT_SCHEMA = "k string, b long, v long"
LAST_BATCH = 2
HOUR_MS = 3_600_000


class ValueOps(Sub):
    """``ValueState``: ``exists``, ``get``, ``update``, ``clear`` (schema as DDL)."""

    name = "value"

    def init(self, handle: Any) -> None:
        self.state = handle.getValueState("value_s", "n long, last string")

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        s = self.state
        out: list[Any] = [("before", s.exists(), s.get())]
        for r in records:
            if r["v"] < 0:
                s.clear()
                out.append(("clear", s.exists(), s.get()))
            else:
                cur = s.get()
                s.update(((cur[0] if cur else 0) + r["v"], f"b{r['b']}"))
                out.append(("update", s.exists(), s.get()))
        return out


class ListOps(Sub):
    """``ListState``: ``exists``, ``get``, ``put``, ``appendValue``, ``appendList``, ``clear``
    (schema as a ``StructType``)."""

    name = "list"

    def init(self, handle: Any) -> None:
        schema = StructType([StructField("n", LongType()), StructField("t", StringType())])
        self.state = handle.getListState("list_s", schema)

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        s = self.state
        out: list[Any] = [("before", s.exists(), list(s.get()))]
        for r in records:
            v = r["v"]
            if v < 0:
                s.clear()
                op = "clear"
            elif v % 3 == 0:
                s.appendValue((v, "one"))
                op = "appendValue"
            elif v % 3 == 1:
                s.appendList([(v, "x"), (v + 1, "y")])
                op = "appendList"
            else:
                s.put([(v, "put")])
                op = "put"
            out.append((op, s.exists(), list(s.get())))
        return out


class MapOps(Sub):
    """``MapState``: every method (key schema DDL, value schema ``StructType``)."""

    name = "map"

    def init(self, handle: Any) -> None:
        value = StructType([StructField("n", LongType()), StructField("t", StringType())])
        self.state = handle.getMapState("map_s", "name string", value)

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        s = self.state
        out: list[Any] = [("before", s.exists(), sorted(s.iterator()))]
        for r in records:
            v = r["v"]
            name = f"n{v % 4}"
            if v < 0:
                s.clear()
                out.append(("clear", s.exists(), list(s.iterator())))
                continue
            out.append(("get", s.getValue((name,)), s.containsKey((name,))))
            if v % 5 == 4:
                s.removeKey((name,))
                out.append(("removeKey", s.containsKey((name,)), s.getValue((name,))))
            else:
                s.updateValue((name,), (v, f"b{r['b']}"))
                out.append(("updateValue", s.containsKey((name,)), s.getValue((name,))))
        out.append(("keys", sorted(s.keys())))
        out.append(("values", sorted(s.values())))
        out.append(("iterator", sorted(s.iterator())))
        return out


class MapOrder(Sub):
    """``MapState.keys`` / ``values`` / ``iterator`` give the entries in one order (keys and
    values line up with the iterator's pairs), the same on every call.

    Which order is unspecified by Spark, and differs (the table's ``differs`` rows, a
    deliberate choice): Spark 4.3 iterates in the byte order of its RocksDB key encoding
    (``("k3",-3), ("k2",-2), ("k1",-1), ("k12",-12)`` here), dstl in that of its own.
    The entries themselves are compared sorted.
    """

    name = "maporder"

    def init(self, handle: Any) -> None:
        self.state = handle.getMapState("maporder_s", "name string, i int", "n long")

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        s = self.state
        for r in records:
            v = r["v"]
            s.updateValue((f"k{v}", -v), (v,))
        items = [(tuple(k), tuple(v)) for k, v in s.iterator()]
        keys = list(map(tuple, s.keys()))
        values = [tuple(v) for v in s.values()]
        return [
            ("entries", sorted(items)),
            ("one order", items == list(zip(keys, values, strict=True))),
            ("stable", items == [(tuple(k), tuple(v)) for k, v in s.iterator()]),
        ]


class Ttl(Sub):
    """TTL on value, list and map state: 1 ms (gone in the next batch) and an hour (kept)."""

    name = "ttl"

    def init(self, handle: Any) -> None:
        self.v1 = handle.getValueState("ttl_v1", "n long", ttlDurationMs=1)
        self.vh = handle.getValueState("ttl_vh", "n long", ttlDurationMs=HOUR_MS)
        self.l1 = handle.getListState("ttl_l1", "n long", ttlDurationMs=1)
        self.lh = handle.getListState("ttl_lh", "n long", ttlDurationMs=HOUR_MS)
        self.m1 = handle.getMapState("ttl_m1", "k string", "n long", ttlDurationMs=1)
        self.mh = handle.getMapState("ttl_mh", "k string", "n long", ttlDurationMs=HOUR_MS)

    def _seen(self) -> Any:
        return (
            self.v1.exists(),
            self.v1.get(),
            self.vh.get(),
            list(self.l1.get()),
            list(self.lh.get()),
            self.l1.exists(),
            sorted(self.m1.iterator()),
            sorted(self.mh.iterator()),
            self.m1.exists(),
            self.m1.containsKey(("a",)),
        )

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        out: list[Any] = [("before", self._seen())]
        for r in records:
            v = r["v"]
            if v % 2 == 0:
                self.v1.update((v,))
                self.vh.update((v,))
                self.l1.appendValue((v,))
                self.lh.appendValue((v,))
                self.m1.updateValue(("a",), (v,))
                self.mh.updateValue(("a",), (v,))
            else:  # only the hour-long ones: the 1 ms ones of earlier batches stay expired
                self.vh.update((v,))
                self.lh.appendList([(v,)])
                self.mh.updateValue((f"b{v}",), (v,))
        out.append(("after", self._seen()))
        return out


class Timers(Sub):
    """Processing-time timers: ``registerTimer``, ``deleteTimer``, ``listTimers``,
    ``handleExpiredTimer`` (keys with and without input), ``ExpiredTimerInfo``.

    Per input call: a timer already due (fires after this batch's input), one due in
    the next batch (not in the last batch: Spark would fire it in a batch without
    data), one an hour away that is deleted and one that stays.
    """

    name = "timers"

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.fired = handle.getValueState("timers_fired", "n long")

    def _listed(self, now: int) -> list[str]:
        """``listTimers()`` relative to ``now``: this batch's timers exactly, others by side
        (an earlier batch's timers are an unknown time away)."""
        out = []
        for t in self.handle.listTimers():
            d = t - now
            out.append(str(d) if abs(d) <= 10 else "earlier" if d < 0 else "later")
        return sorted(out)

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        h = self.handle
        now = timerValues.getCurrentProcessingTimeInMs()
        before = sum(1 for _ in h.listTimers())
        h.registerTimer(now - 5)
        if records[0]["b"] < LAST_BATCH:
            h.registerTimer(now + 1)
        h.registerTimer(now + HOUR_MS)
        h.registerTimer(now + HOUR_MS + 1)
        h.deleteTimer(now + HOUR_MS)
        h.deleteTimer(now + 7)  # no such timer: nothing happens
        return [("timers", before, self._listed(now), sum(1 for _ in h.listTimers()))]

    def timer(self, key: str, timerValues: Any, expiredTimerInfo: Any) -> Sequence[Any]:
        now = timerValues.getCurrentProcessingTimeInMs()
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        fired = self.fired.get()
        n = (fired[0] if fired else 0) + 1
        self.fired.update((n,))
        # an earlier batch's timer fires at a time that differs by run: say only that
        when = expiry - now if expiry - now == -5 else "earlier batch"
        return [("fired", when, n, self._listed(now))]


class DeleteState(Sub):
    """``deleteIfExists`` in ``init``: of a variable declared before (and not used after), and
    of a name never declared; the other variables keep their values.

    (Using a deleted variable raises in Spark, and Spark's state connection does not
    survive a failed call, so a processor cannot observe that and go on.)
    """

    name = "delete"

    def init(self, handle: Any) -> None:
        handle.getValueState("delete_gone", "n long")
        handle.deleteIfExists("delete_gone")
        handle.deleteIfExists("delete_never_declared")
        self.kept = handle.getValueState("delete_kept", "n long")

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        cur = self.kept.get()
        self.kept.update(((cur[0] if cur else 0) + len(records),))
        return [("kept", cur, self.kept.get())]


class Initial(Sub):
    """``handleInitialState``: keys with and without input; a timer registered there."""

    name = "initial"

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.state = handle.getValueState("initial_s", "n long")

    def initial(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> None:
        cur = self.state.get()
        total = (cur[0] if cur else 0) + sum(r["n"] for r in records)
        self.state.update((total,))
        if key.endswith(":idle"):
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        cur = self.state.get()
        self.state.update(((cur[0] if cur else 0) + sum(r["v"] for r in records),))
        return [("state", cur, self.state.get())]

    def timer(self, key: str, timerValues: Any, expiredTimerInfo: Any) -> Sequence[Any]:
        return [("timer", self.state.get())]


class Times(Sub):
    """``TimerValues`` in input, timer and initial-state calls (processing time > 0)."""

    name = "times"

    def init(self, handle: Any) -> None:
        self.handle = handle

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        now = timerValues.getCurrentProcessingTimeInMs()
        if records[0]["b"] == 0:
            self.handle.registerTimer(now - 1)
        return [("input", now > 0, timerValues.getCurrentWatermarkInMs())]

    def timer(self, key: str, timerValues: Any, expiredTimerInfo: Any) -> Sequence[Any]:
        now = timerValues.getCurrentProcessingTimeInMs()
        return [("timer", now > 0, timerValues.getCurrentWatermarkInMs())]


SUBS: tuple[type[Sub], ...] = (
    ValueOps,
    ListOps,
    MapOps,
    MapOrder,
    Ttl,
    Timers,
    DeleteState,
    Initial,
    Times,
)

#: per batch: (key, v); every sub-processor gets keys with input in some batches only
_SCRIPT: dict[str, list[list[tuple[str, int]]]] = {
    "value": [[("a", 1), ("a", 2), ("b", 5)], [("a", 3)], [("a", -1), ("b", 4)]],
    "list": [[("a", 0), ("a", 1), ("b", 2)], [("a", 3), ("b", 4)], [("a", -1), ("b", 5), ("c", 6)]],
    "map": [
        [("a", 0), ("a", 1), ("a", 2), ("b", 4)],
        [("a", 5), ("a", 9), ("b", 3)],
        [("a", -1), ("b", 7)],
    ],
    "maporder": [[("a", 3), ("a", 1), ("a", 12), ("a", 2)], [("a", 0)], []],
    "ttl": [[("a", 0), ("a", 1)], [("a", 3), ("b", 2)], [("a", 4), ("b", 5)]],
    "timers": [[("a", 1), ("b", 1)], [("a", 1), ("c", 1)], [("d", 1)]],
    "delete": [[("a", 1)], [("a", 1), ("a", 2)], []],
    "initial": [[("a", 5)], [("a", 1)], []],
    "times": [[("a", 1)], [("a", 1)], []],
}


def batches() -> list[list[tuple[str, int, int]]]:
    """The input rows ``(k, b, v)`` per micro-batch."""
    out: list[list[tuple[str, int, int]]] = [[] for _ in range(LAST_BATCH + 1)]
    for sub, per_batch in _SCRIPT.items():
        for b, rows in enumerate(per_batch):
            out[b].extend((f"{sub}:{k}", b, v) for k, v in rows)
    return out


INITIAL_SCHEMA = "k string, n long"
INITIAL_ROWS = [("initial:a", 10), ("initial:a", 5), ("initial:idle", 7)]
