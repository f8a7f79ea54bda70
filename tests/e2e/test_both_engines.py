"""The same processor on Spark's ``transformWithStateInPandas`` (RocksDB) and on dstl's
``transform_with_state``, on the same backlog of input: the same rows, batch by batch.

One run of :class:`Probe` (event time, a non-UTC session time zone, an
initial state) serves every test here; each test compares the rows of one
concern (issue 22 items 1-5 and 7, issue 17 item 2).
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql.streaming.stateful_processor import StatefulProcessor as SparkStatefulProcessor

from dstl_server.testing import ServerProcess
from tests.e2e._both_engines import Case, Rows, data_batches, run_both

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
ZONE = "America/Los_Angeles"
INPUT = (
    "k string, ts timestamp, ntz timestamp_ntz, d date, dec decimal(10,2), arr array<int>, "
    "m map<string,int>, st struct<a:int,b:string>, bin binary, i int, f float"
)
OUTPUT = "k string, what string, info string, at timestamp"
STATE = "n long, nested struct<x:int,y:string>, tags array<string>, at timestamp, d date"


def row(k: str, seconds: int) -> tuple[Any, ...]:
    at = T0 + datetime.timedelta(seconds=seconds)
    return (
        k,
        at,
        datetime.datetime(2024, 1, 1, 12, 0, seconds % 60),
        datetime.date(2024, 2, 3),
        decimal.Decimal("12.34"),
        [seconds, None],
        {"x": seconds},
        (seconds, "q"),
        b"\x00\x01",
        seconds,
        1.5,
    )


#: delay 10 s; the watermark of batch N is the largest event time before it, less 10 s
BATCHES = [
    [row("a", 20), row("b", 30)],  # batch 1's watermark: 20 s
    [row("a", 60), row("c", 25)],  # batch 2's watermark: 50 s
    # b@40: after batch 1's watermark, before batch 2's: Spark processes it; a@15 is late
    [row("b", 40), row("a", 15), row("c", 70)],
]


def describe(v: Any) -> str:
    """A value with its type, nested values included (Row, tuple, list, dict, arrays)."""
    if hasattr(v, "asDict") and hasattr(v, "__fields__"):
        return "Row(" + ",".join(f"{k}={describe(x)}" for k, x in v.asDict().items()) + ")"
    if isinstance(v, tuple | list):
        return type(v).__name__ + "[" + ",".join(describe(x) for x in v) + "]"
    if isinstance(v, dict):
        return "dict{" + ",".join(f"{describe(k)}:{describe(x)}" for k, x in v.items()) + "}"
    if type(v).__name__ == "ndarray":
        return f"ndarray<{v.dtype}>[" + ",".join(describe(x) for x in v.tolist()) + "]"
    return f"{type(v).__module__}.{type(v).__name__}:{v!r}"


class Probe(SparkStatefulProcessor):  # type: ignore[misc]
    """Reports what it is handed: input and initial-state frames, state values, errors."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.obj = handle.getValueState("obj", STATE)
        self.names = handle.getMapState("names", "name string", "n int")
        self.init_seen = handle.getValueState("init_seen", "info string")
        self.gone = handle.getValueState("gone", "n long")
        handle.deleteIfExists("gone")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        k = key[0]
        out = []
        latest = None
        for pdf in rows:
            at = pdf["ts"].max()
            latest = at if latest is None else max(latest, at)
            dtypes = json.dumps({c: str(t) for c, t in pdf.dtypes.items()})
            cells = json.dumps({c: describe(pdf.iloc[0][c]) for c in pdf.columns})
            # Spark's own event-time idiom: int64 nanoseconds to seconds
            secs = ",".join(str(s) for s in sorted(pdf["ts"].astype("int64") // 10**9))
            out += [("dtypes", dtypes, at), ("cells", cells, at), ("seconds", secs, at)]
        n = len(list(self.names.keys()))
        self.obj.update(
            (n, {"x": n, "y": k}, [k, "t"], datetime.datetime(2024, 5, 6, 7, 8, 9), None)
        )
        got = self.obj.get()
        out.append(("state", describe(got), None))
        out.append(("nested", json.dumps(got[1].asDict()), None))
        self.names.updateValue(k, (n + 1,))  # a bare str key of a one-string-field schema
        out.append(("map", describe(self.names.getValue(k)), None))
        try:
            self.gone.exists()
            out.append(("deleted", "usable", None))
        except Exception:
            out.append(("deleted", "raises", None))
        if self.init_seen.exists():
            out.append(("initial", self.init_seen.get()[0], None))
            self.init_seen.clear()
        assert latest is not None
        self.handle.registerTimer(int(latest.value // 10**6) + 1)  # ms after the latest event
        yield pd.DataFrame(
            {
                "k": [k] * len(out),
                "what": [w for w, _, _ in out],
                "info": [i for _, i, _ in out],
                "at": [a for _, _, a in out],
            }
        )

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
        import pandas as pd

        ms = expiredTimerInfo.getExpiryTimeInMs()
        watermark = timerValues.getCurrentWatermarkInMs()
        yield pd.DataFrame(
            {"k": [key[0]], "what": ["timer"], "info": [f"{ms} at {watermark}"], "at": [None]}
        )

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        dtypes = json.dumps({c: str(t) for c, t in initialState.dtypes.items()})
        cells = json.dumps({c: describe(initialState.iloc[0][c]) for c in initialState.columns})
        self.init_seen.update((dtypes + " " + cells,))

    def close(self) -> None:
        pass


CASE = Case(
    input_schema=INPUT,
    batches=BATCHES,
    key="k",
    output_schema=OUTPUT,
    time_mode="EventTime",
    watermark=("ts", "10 seconds"),
    initial=("k string, since timestamp, n int", [("a", T0, 7)]),
    conf={"spark.sql.session.timeZone": ZONE},
)


@pytest.fixture(scope="module")
def both(
    spark: Any, sidecar: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Rows, Rows]:
    """The probe's output on each engine (first the run's own checks)."""
    by_spark, by_dstl = run_both(
        spark, sidecar.address, tmp_path_factory.mktemp("probe"), Probe, CASE
    )
    n = len(BATCHES)
    assert sorted(data_batches(by_spark, n)) == list(range(n))
    return data_batches(by_spark, n), by_dstl


def rows_of(rows: Rows, *what: str) -> Rows:
    return {b: [r for r in rs if r[1] in what] for b, rs in rows.items()}


def test_late_rows_are_filtered_at_the_previous_batchs_watermark_under_a_backlog(
    both: tuple[Rows, Rows],
) -> None:
    """Issue 17.2 / 22.7: b@40 in batch 2 lies between batch 1's and batch 2's watermarks."""
    by_spark, by_dstl = both
    assert rows_of(by_dstl, "seconds", "timer") == rows_of(by_spark, "seconds", "timer")
    # Spark processed b@40 in batch 2 and dropped a@15 (at or before batch 1's watermark)
    seconds = [r for r in by_spark[2] if r[1] == "seconds"]
    assert ("b", local_seconds(40)) in [(r[0], r[2]) for r in seconds]
    assert not [r for r in seconds if str(local_seconds(15)) in r[2].split(",")]


def local_seconds(offset_s: int) -> str:
    """What ``pdf["ts"].astype("int64") // 10**9`` gives for ``T0 + offset_s``: Spark hands
    pandas the session zone's wall-clock time, without a zone."""
    from zoneinfo import ZoneInfo

    wall = (T0 + datetime.timedelta(seconds=offset_s)).astimezone(ZoneInfo(ZONE))
    return str(int(wall.replace(tzinfo=datetime.UTC).timestamp()))


def test_a_timestamp_in_the_output_schema_round_trips_in_the_session_zone(
    both: tuple[Rows, Rows],
) -> None:
    """Issue 22.1: the query starts and ``at`` comes back as Spark writes it."""
    by_spark, by_dstl = both
    assert by_dstl == by_spark


def test_pandas_frames_have_sparks_dtypes_and_values(both: tuple[Rows, Rows]) -> None:
    """Issue 22.2: input and initial-state frames as Spark hands them over."""
    by_spark, by_dstl = both
    assert rows_of(by_dstl, "dtypes", "cells", "initial") == rows_of(
        by_spark, "dtypes", "cells", "initial"
    )
    dtypes = json.loads(next(r[2] for r in by_spark[0] if r[1] == "dtypes"))
    assert dtypes["ts"] == dtypes["ntz"] == "datetime64[ns]"


def test_state_values_come_back_as_sparks_nested_rows(both: tuple[Rows, Rows]) -> None:
    """Issue 22.3: a nested struct in state is a Row (``asDict`` works), lists and dicts too."""
    by_spark, by_dstl = both
    assert rows_of(by_dstl, "state", "nested") == rows_of(by_spark, "state", "nested")


def test_a_variable_deleted_in_init_raises_when_used(both: tuple[Rows, Rows]) -> None:
    """Issue 22.4: ``deleteIfExists`` in ``init`` leaves the variable unusable, as in Spark."""
    by_spark, by_dstl = both
    assert rows_of(by_dstl, "deleted") == rows_of(by_spark, "deleted")
    assert {r[2] for rs in by_spark.values() for r in rs if r[1] == "deleted"} == {"raises"}


def test_map_state_takes_a_bare_str_key_and_returns_a_row(both: tuple[Rows, Rows]) -> None:
    """Issue 22.5: one-character keys given as a bare ``str``; ``getValue`` returns a Row."""
    by_spark, by_dstl = both
    assert rows_of(by_dstl, "map") == rows_of(by_spark, "map")
