"""Batch times from Spark's offsets log, the watermark rule, and options from ``spark.dstl.*``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dstl_client.batch.options import KeyedOptions
from dstl_client.core.errors import ConfigError, DstlError, InvalidArgument
from dstl_client.processor.conf import merged_options, option_name, options_of
from dstl_client.processor.times import (
    BatchTimes,
    batch_times,
    next_watermark,
    parse_duration_ms,
    read_offsets_entry,
    times_from_offsets,
)


def _entry(watermark: int, timestamp: int) -> list[Any]:
    meta = {"batchWatermarkMs": watermark, "batchTimestampMs": timestamp, "conf": {}}
    return ["v1", json.dumps(meta), '{"logOffset":3}']


def test_the_watermark_follows_the_largest_event_time_minus_the_delay_and_never_goes_back() -> None:
    wm = 0  # Spark's watermark before any event time
    seen = []
    for batch_max in (10_000, 25_000, 12_000, None, 40_000):
        wm = next_watermark(wm, batch_max, 5_000)
        seen.append(wm)
    assert seen == [5_000, 20_000, 20_000, 20_000, 35_000]


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("10 seconds", 10_000),
        ("1 second", 1_000),
        ("interval 2 minutes", 120_000),
        ("1 minute 30 seconds", 90_000),
        ("500 milliseconds", 500),
        ("1.5 hours", 5_400_000),
        ("1 day", 86_400_000),
    ],
)
def test_watermark_delays_parse_as_spark_intervals(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["", "ten seconds", "10 fortnights", "10"])
def test_bad_delays_are_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_duration_ms(bad)


def test_batch_times_come_from_the_offsets_log_entry(tmp_path: Path) -> None:
    offsets = tmp_path / "spark" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "4").write_text("\n".join(_entry(7_000, 1_700_000_000_123)))
    entry = read_offsets_entry(str(tmp_path / "spark"), 4, session=None)
    assert read_offsets_entry(str(tmp_path / "spark"), 5, session=None) is None
    plain = times_from_offsets(entry, event_time=False)
    assert plain == BatchTimes(processing_ms=1_700_000_000_123, watermark_ms=7_000)
    timed = times_from_offsets(entry, event_time=True)
    assert timed == BatchTimes(1_700_000_000_123, watermark_ms=7_000, late_watermark_ms=7_000)
    assert timed.timers_due_at("EventTime") == 7_000
    assert timed.timers_due_at("ProcessingTime") == 1_700_000_000_123
    assert timed.timers_due_at("None") is None
    assert timed.timer_values("None").getCurrentProcessingTimeInMs() == -1
    assert timed.timer_values("EventTime").getCurrentWatermarkInMs() == 7_000
    with pytest.raises(InvalidArgument):
        times_from_offsets(["v1", "{}"], event_time=False)


def test_late_rows_are_bounded_by_the_previous_batchs_watermark(tmp_path: Path) -> None:
    """Spark's "watermark for late events": the previous batch's; timers use this batch's."""
    offsets = tmp_path / "spark" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("\n".join(_entry(0, 1_000)))
    (offsets / "1").write_text("\n".join(_entry(20_000, 2_000)))
    (offsets / "2").write_text("\n".join(_entry(50_000, 3_000)))
    spark = str(tmp_path / "spark")
    assert batch_times(spark, 2, None, event_time=True) == BatchTimes(
        3_000, watermark_ms=50_000, late_watermark_ms=20_000
    )
    # the first batch has no previous one: its own watermark, as in Spark
    assert batch_times(spark, 0, None, event_time=True).late_watermark_ms == 0
    assert batch_times(spark, 1, None, event_time=False) == BatchTimes(2_000, watermark_ms=20_000)
    with pytest.raises(DstlError, match="no offsets log entry of batch 3"):
        batch_times(spark, 3, None, event_time=True)


def test_timer_values_give_sparks_watermark_in_every_time_mode() -> None:
    """Spark 4.3's ``TimerValues.getCurrentWatermarkInMs``: ``-1`` in time mode None (its
    client does not ask), else the batch's ``batchWatermarkMs``, which is ``0`` in a query
    without event time (ProcessingTime) and before the first watermark (EventTime)."""
    no_event_time = times_from_offsets(_entry(0, 5_000), event_time=False)
    assert no_event_time.timer_values("ProcessingTime").getCurrentWatermarkInMs() == 0
    assert no_event_time.timer_values("ProcessingTime").getCurrentProcessingTimeInMs() == 5_000
    assert no_event_time.timer_values("None").getCurrentWatermarkInMs() == -1
    assert no_event_time.late_watermark_ms == -1  # no row is late without event time
    first = times_from_offsets(_entry(0, 5_000), event_time=True)
    assert first.timer_values("EventTime").getCurrentWatermarkInMs() == 0
    later = times_from_offsets(_entry(9_000, 6_000), event_time=True, previous=_entry(0, 5_000))
    for mode in ("ProcessingTime", "EventTime"):  # a watermark in time mode ProcessingTime too
        assert later.timer_values(mode).getCurrentWatermarkInMs() == 9_000
    assert later.timer_values("None").getCurrentWatermarkInMs() == -1


def test_spark_dstl_keys_become_typed_options() -> None:
    assert option_name("spark.dstl.maxParallelism") == "max_parallelism"
    assert option_name("spark.dstl.dstl_address") == "dstl_address"
    got = options_of(
        {
            "spark.dstl.parallelism": "4",
            "spark.dstl.maxParallelism": "64",
            "spark.dstl.materializeIntervalS": "2.5",
            "spark.dstl.fsync": "false",
            "spark.dstl.dstlToken": "none",
            "spark.dstl.metricsPort": "0",
            "spark.dstl.trigger": '{"processingTime": "1 second"}',
            "spark.dstl.noSuchOption": "ignored",
            "spark.dstl.onPhase": "ignored too",
            "spark.sql.shuffle.partitions": "2",
        }
    )
    assert got == {
        "parallelism": 4,
        "max_parallelism": 64,
        "materialize_interval_s": 2.5,
        "fsync": False,
        "dstl_token": None,
        "metrics_port": 0,
        "trigger": {"processingTime": "1 second"},
    }
    with pytest.raises(ConfigError, match=r"spark\.dstl\.parallelism"):
        options_of({"spark.dstl.parallelism": "four"})
    with pytest.raises(ConfigError, match="boolean"):
        options_of({"spark.dstl.fsync": "yes"})


def test_explicit_options_win_over_the_spark_configuration() -> None:
    session = SimpleNamespace(
        conf=SimpleNamespace(
            getAll={
                "spark.dstl.checkpointDir": "/from/conf",
                "spark.dstl.parallelism": "3",
                "spark.dstl.retain": "5",
                "spark.dstl.stateDir": "/conf/state",
            }
        )
    )
    opts = merged_options(session, None, {"parallelism": 2})
    assert (opts.checkpoint_dir, opts.parallelism, opts.retain) == ("/from/conf", 2, 5)
    given = KeyedOptions(checkpoint_dir="/given", parallelism=1, retain=4)
    opts = merged_options(session, given, {})
    # a field the config object sets is explicit; one left at its default takes the conf's
    assert (opts.checkpoint_dir, opts.parallelism, opts.retain) == ("/given", 1, 4)
    assert opts.state_dir == "/conf/state"
    with pytest.raises(TypeError, match="checkpoint_dir"):
        merged_options(SimpleNamespace(conf=SimpleNamespace(getAll={})), None, {"parallelism": 1})
