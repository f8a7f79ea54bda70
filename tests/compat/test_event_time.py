"""Time mode EventTime on both engines: event-time timers, watermark, late rows, timestamp output.

Rows style (``transformWithState``) for the timers and late rows
(:mod:`._event_subs`); pandas style for a processor that emits its event
time in ``timestamp`` / ``timestamp_ntz`` columns.
"""

from __future__ import annotations

import pytest

from tests.compat import _event_subs as ev
from tests.compat._engines import Case, Outcomes
from tests.compat._known import marks
from tests.compat._multiplex import OUTPUT_SCHEMA, Multiplex

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

EVENTS = Case(
    name="event-rows",
    processor=lambda: Multiplex([s() for s in ev.SUBS], use_pandas=False),
    input_schema=ev.INPUT_SCHEMA,
    batches=ev.batches(),
    output_schema=OUTPUT_SCHEMA,
    time_mode="EventTime",
    use_pandas=False,
    event_time_column="ts",
    watermark_delay=ev.DELAY,
)

TS_OUTPUT = Case(
    name="event-ts-output",
    processor=lambda: Multiplex([ev.TimestampOut()], True, ev.TimestampOut.columns),
    input_schema=ev.INPUT_SCHEMA,
    batches=ev.TS_BATCHES,
    output_schema=ev.TS_OUTPUT_SCHEMA,
    time_mode="EventTime",
    event_time_column="ts",
    watermark_delay=ev.DELAY,
)

#: known differences: ``event:<sub>`` (``event:tsout``: the timestamp output case)
XFAIL: dict[str, str] = {}


@pytest.mark.parametrize(
    "sub", [pytest.param(s.name, marks=marks(XFAIL, f"event:{s.name}")) for s in ev.SUBS]
)
def test_event_time_gives_sparks_rows(outcomes: Outcomes, sub: str) -> None:
    spark_rows, dstl_rows = outcomes.of(EVENTS).pair(lambda r: r[1] == sub)
    assert spark_rows, f"Spark gave no rows for {sub}: the case tests nothing"
    assert dstl_rows == spark_rows


@pytest.mark.parametrize("ref", [pytest.param("tsout", marks=marks(XFAIL, "event:tsout"))])
def test_timestamp_output_gives_sparks_rows(ref: str, outcomes: Outcomes) -> None:
    spark_rows, dstl_rows = outcomes.of(TS_OUTPUT).pair()
    assert spark_rows
    assert dstl_rows == spark_rows
