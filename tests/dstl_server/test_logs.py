"""The sidecar's JSON log lines: ISO timestamps, structured fields, the start banner at INFO."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dstl_client.client import ChangelogClient
from dstl_server.logs import setup_logging
from dstl_server.testing import ServerProcess


@pytest.fixture
def dstl_logger() -> Iterator[logging.Logger]:
    """The ``dstl_server`` logger, its handlers, level and propagation restored afterwards."""
    logger = logging.getLogger("dstl_server")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    try:
        yield logger
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_json_lines_with_iso_time_and_structured_fields(
    dstl_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("info")
    log = logging.getLogger("dstl_server.somewhere")
    log.debug("not shown")
    log.info("writer created", extra={"job_id": "j1", "log_id": "ab" * 16, "duration_s": 0.25})
    log.warning("unknown variable", extra={"fields": {"variable": "SOME_VARIABLE"}})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"object_key": "j1/00/x.dstl"})
    first, second, third = lines(capsys.readouterr().err)
    assert list(first)[:4] == ["ts", "level", "logger", "msg"]
    stamp = datetime.fromisoformat(first["ts"])
    assert stamp.tzinfo is not None and stamp.utcoffset() is not None
    assert first["level"] == "info" and first["logger"] == "dstl_server.somewhere"
    assert first["msg"] == "writer created"  # the ids are fields, not text
    assert (first["job_id"], first["duration_s"]) == ("j1", 0.25)
    assert second["variable"] == "SOME_VARIABLE" and "fields" not in second
    assert third["level"] == "error" and third["object_key"] == "j1/00/x.dstl"
    assert "ValueError: boom" in third["exc"]


def test_quiet_by_default_and_the_banner_at_info(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "quiet") as proc:
        assert proc.store_up
    assert lines(proc.stderr_path.read_text()) == []  # WARNING: nothing to say

    with ServerProcess(tmp_path / "info", extra_args=["--log-level", "INFO"]) as proc:
        with ChangelogClient(proc.address) as client:
            writer = client.create_writer(job_id="logs", operator_id="op", key_group_range=(0, 3))
            writer.close()
        epoch = proc.epoch
    logged = lines(proc.stderr_path.read_text())
    (banner,) = [d for d in logged if d["msg"] == "dstl-server serving"]
    assert banner["level"] == "info"
    assert banner["store_up"] is True and banner["epoch"] == epoch
    assert banner["storage"].startswith("file://") and banner["metrics_port"] == proc.metrics_port
    (created,) = [d for d in logged if d["msg"] == "writer created"]
    assert created["job_id"] == "logs" and len(created["log_id"]) == 32
    assert created["key_groups"] == [0, 3]
