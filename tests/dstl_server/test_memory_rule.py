"""The sidecar's memory rule (docs/sidecar.md, "Memory") and its start-up warning."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_server.memory_rule import (
    OVERHEAD_BYTES,
    cgroup_memory_limit,
    memory_needed,
    memory_shortfall,
    warn_if_memory_short,
)
from dstl_server.settings import ServerSettings

MiB = 1 << 20


def test_the_defaults_need_488_mib() -> None:
    need = memory_needed(ServerSettings())
    # 2 x 100 MiB in flight + 64 MiB read cache + 64 MiB request + 160 MiB
    assert need.total == 488 * MiB
    assert need.explain() == (
        "2 x max_in_flight_bytes (200 MiB) + read_cache_bytes (64 MiB) "
        "+ max_request_bytes (64 MiB) + 160 MiB overhead = 488 MiB"
    )
    assert memory_shortfall(512 * MiB, ServerSettings()) is None  # the chart's default limit
    assert memory_shortfall(488 * MiB, ServerSettings()) is None


def test_a_limit_below_the_rule_says_so_with_the_numbers() -> None:
    settings = ServerSettings(max_in_flight_bytes=256 * MiB, read_cache_bytes=0)
    short = memory_shortfall(512 * MiB, settings)
    assert short is not None
    assert short.startswith("the container's memory limit of 512 MiB is below")
    assert "2 x max_in_flight_bytes (512 MiB) + read_cache_bytes (0 MiB)" in short
    assert f"+ {OVERHEAD_BYTES // MiB} MiB overhead = 736 MiB" in short
    assert "docs/sidecar.md" in short


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("536870912\n", 512 * MiB),  # v2 memory.max, v1 memory.limit_in_bytes
        ("max\n", None),  # v2: no limit
        ("9223372036854771712\n", None),  # v1: no limit
        ("garbage", None),
        ("0", None),
    ],
)
def test_cgroup_limit_from_the_file(tmp_path: Path, text: str, limit: int | None) -> None:
    path = tmp_path / "memory.max"
    path.write_text(text)
    assert cgroup_memory_limit([tmp_path / "absent", path]) == limit


def test_no_cgroup_file_no_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit([tmp_path / "memory.max"]) is None


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Records of the rule's logger (whatever an earlier test did to ``dstl_server``'s)."""
    logger = logging.getLogger("dstl_server.memory_rule")
    handler = _Records()
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


def test_start_warning_from_an_injected_cgroup_file(
    tmp_path: Path, records: list[logging.LogRecord]
) -> None:
    """One WARNING with the numbers when the limit is short; nothing when it fits."""
    path = tmp_path / "memory.max"
    path.write_text(f"{256 * MiB}\n")
    text = warn_if_memory_short(ServerSettings(), [path])
    (record,) = records
    assert record.levelno == logging.WARNING and record.getMessage() == text
    assert text is not None and "256 MiB is below" in text and "= 488 MiB" in text
    assert record.__dict__["memory_limit_bytes"] == 256 * MiB
    assert record.__dict__["memory_needed_bytes"] == 488 * MiB
    records.clear()
    path.write_text(f"{512 * MiB}\n")
    assert warn_if_memory_short(ServerSettings(), [path]) is None
    assert records == []
