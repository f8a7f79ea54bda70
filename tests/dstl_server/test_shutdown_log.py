"""The one INFO line a clean shutdown logs: what it drained, in how long."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dstl_client.client import ChangelogClient
from dstl_server.testing import ServerProcess
from tests.integration._helpers import poll_until


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_sigterm_logs_what_was_drained_at_info(tmp_path: Path) -> None:
    """A persist waiting at SIGTERM is flushed and uploaded; unpersisted changes are dropped.

    The line says both, with the time the drain took, at INFO (shown with
    ``--log-level INFO``).
    """
    args = ["--log-level", "INFO", "--persist-delay-ms", "600000"]  # nothing leaves by itself
    with (
        ServerProcess(tmp_path / "srv", extra_args=args) as server,
        ChangelogClient(server.address) as client,
    ):
        persisted = client.create_writer(job_id="a", operator_id="op", key_group_range=(0, 3))
        for kg in range(4):
            persisted.append(kg, b"p" * 1000)
        # the job's other writer never persists: the flush waits for the persist delay
        dropped = client.create_writer(job_id="a", operator_id="op", key_group_range=(4, 5))
        dropped.append(4, b"d" * 3000)
        dropped.flush()  # on the sidecar, never asked to persist
        handle = persisted.persist_durably(0)  # queued until the shutdown flushes it
        poll_until(
            lambda: server.scrape_metrics().get("dstl_persist_requests_total", 0) >= 1,
            "the persist reached the sidecar",
        )
        assert server.stop() == 0
        assert handle.result(timeout=10).entries  # the shutdown's flush made it durable
    (line,) = [d for d in _lines(server.stderr_path) if d["msg"].startswith("shutdown: drained")]
    assert line["level"] == "info" and line["logger"] == "dstl_server.app"
    assert line["drained"] is True
    assert line["held_bytes_at_stop"] >= 7000
    assert line["flushes"] == 1 and line["uploads_finished"] == 1
    assert line["uploaded_bytes"] >= 4000
    assert line["uploads_failed"] == 0 and line["persists_abandoned"] == 0
    assert 3000 <= line["unpersisted_bytes_dropped"] < line["held_bytes_at_stop"]
    assert 0 <= line["duration_s"] < 30
    assert "1 upload(s) finished" in line["msg"]
    assert f"{line['unpersisted_bytes_dropped']} bytes never asked to persist" in line["msg"]


def test_quiet_by_default(tmp_path: Path) -> None:
    """At the default WARNING level a clean shutdown writes nothing."""
    with ServerProcess(tmp_path / "srv") as server:
        assert server.stop() == 0
    assert _lines(server.stderr_path) == []
