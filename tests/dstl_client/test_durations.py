"""The one duration parser: every caller's spellings, exact values, and no silent zero."""

from __future__ import annotations

import argparse
from decimal import Decimal

import pytest

from dstl_client.core.durations import parse_duration
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.ops.driver_rest import millis
from dstl_client.spark import KeyedOptions
from dstl_server.cli import _ttl


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("5s", 5_000),
        ("1.1s", 1_100),
        ("10min", 600_000),
        ("10m", 600_000),
        ("2h", 7_200_000),
        ("30d", 2_592_000_000),
        ("1w", 604_800_000),
        ("1 minute 30 seconds", 90_000),
        ("1h30m", 5_400_000),
        ("interval 2 minutes", 120_000),
        ("  5 Seconds ", 5_000),
    ],
)
def test_spellings_and_exact_values(text: str, ms: int) -> None:
    assert parse_duration(text).ms == Decimal(ms)


@pytest.mark.parametrize("bad", ["", "ten seconds", "10 fortnights", "5 s x", "-5s", "1e3s"])
def test_unreadable_text_is_a_typed_error_naming_it(bad: str) -> None:
    with pytest.raises(InvalidArgument, match=repr(bad).replace("\\", "\\\\")):
        parse_duration(bad, what="x")


def test_a_bare_number_is_in_the_callers_unit_or_refused() -> None:
    assert parse_duration("60000", bare_unit="ms").seconds == 60.0
    assert parse_duration(250, bare_unit="ms").seconds == 0.25
    assert parse_duration("3600", bare_unit="s").seconds == 3600.0
    with pytest.raises(InvalidArgument, match="unit"):
        parse_duration("10")
    with pytest.raises(InvalidArgument):
        parse_duration(float("nan"), bare_unit="ms")
    with pytest.raises(InvalidArgument):
        parse_duration(True, bare_unit="ms")


def test_an_unreadable_processing_time_is_an_error_not_zero() -> None:
    """Was 0.0 without a word (then reported as the default interval)."""
    opts = KeyedOptions(
        checkpoint_dir="/tmp/ck", parallelism=1, trigger={"processingTime": "5 fortnights"}
    )
    with pytest.raises(InvalidArgument, match="5 fortnights"):
        opts.coordinator_config()
    for trigger, seconds in (
        ({"processingTime": "5 seconds"}, 5.0),
        ({"processingTime": 1500}, 1.5),
        ({"availableNow": True}, 0.0),
    ):
        cfg = KeyedOptions(
            checkpoint_dir="/tmp/ck", parallelism=1, trigger=trigger
        ).coordinator_config()
        assert cfg.checkpoint_interval_s == seconds


def test_the_cli_and_the_sidecar_read_durations_the_same_way() -> None:
    assert millis("checkpointInterval", "1.5s") == 1500
    assert millis("checkpointInterval", "60000") == 60000
    with pytest.raises(ConfigError, match="whole milliseconds"):
        millis("checkpointInterval", "1.5ms")
    with pytest.raises(ConfigError, match="a duration"):
        millis("checkpointInterval", "soon")
    assert _ttl("12h") == 43_200.0
    assert _ttl("3600") == 3600.0
    for bad in ("forever", "1w", "0"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"--ttl='{bad}'"):
            _ttl(bad)
