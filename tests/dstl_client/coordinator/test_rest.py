"""Dynamic checkpoint configuration: the REST endpoint and in-flight timeouts."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.client import ChangelogClient
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.coordinator.watchdog import CheckpointTimedOut
from dstl_server.testing import ServerProcess
from tests.dstl_client.state._jobs import make_batches, make_coordinator, runner

ROWS = make_batches(1, rows=50, keys=10)[0]


@pytest.fixture
def rest() -> Iterator[CheckpointConfigServer]:
    server = CheckpointConfigServer()
    try:
        yield server
    finally:
        server.close()


def call(
    server: CheckpointConfigServer, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:  # an error response holds the connection's socket until closed
            return exc.code, json.loads(exc.read())


def test_get_and_patch_with_validation(
    tmp_path: Path, sidecar: ServerProcess, rest: CheckpointConfigServer
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="rest", checkpoint_timeout_s=60)
    rest.register(coord)
    status, doc = call(rest, "GET", "/jobs/rest/checkpoints/config")
    assert status == 200
    assert doc["checkpointTimeout"] == 60_000 and doc["materializationInterval"] == 3_600_000
    status, doc = call(
        rest,
        "PATCH",
        "/jobs/rest/checkpoints/configuration",
        {"checkpointTimeout": 5000, "materializationInterval": 250},
    )
    assert status == 200 and doc["checkpointTimeout"] == 5000
    assert coord.config.checkpoint_timeout_s == 5.0 and coord.config.materialize_interval_s == 0.25
    # only the given fields change
    status, doc = call(
        rest, "PATCH", "/jobs/rest/checkpoints/configuration", {"checkpointTimeout": 7000}
    )
    assert status == 200 and doc["materializationInterval"] == 250
    for bad in (
        {"checkpointTimeout": 0},
        {"checkpointTimeout": -5},
        {"checkpointTimeout": "10"},
        {"materializationInterval": 1.5},
        {"checkpointTimeout": True},
        {"unknown": 1},
        {"checkpointInterval": 1000},
        [1, 2],
        b"not json",
    ):
        status, doc = call(rest, "PATCH", "/jobs/rest/checkpoints/configuration", bad)
        assert status == 400, bad
        assert doc["error"]
    assert coord.config.checkpoint_timeout_s == 7.0  # nothing applied by the bad requests
    assert call(rest, "GET", "/jobs/nope/checkpoints/config")[0] == 404
    assert (
        call(rest, "PATCH", "/jobs/nope/checkpoints/configuration", {"checkpointTimeout": 1})[0]
        == 404
    )
    # a concurrent update is refused
    with coord.config_update_lock:
        status, _ = call(
            rest, "PATCH", "/jobs/rest/checkpoints/configuration", {"checkpointTimeout": 9000}
        )
    assert status == 409
    assert coord.config.checkpoint_timeout_s == 7.0
    coord.close()
    # overrides survive a driver restart
    again = make_coordinator(tmp_path, sidecar.address, job_id="rest", checkpoint_timeout_s=60)
    assert again.effective_config()["checkpointTimeout"] == 7000
    assert again.config.materialize_interval_s == 0.25
    again.close()


def _slow_batch(coord: CheckpointCoordinator, client: ChangelogClient, during: Any) -> Any:
    """Plan batch 0, run its tasks, call ``during()`` while it is in flight, then complete."""
    plan = coord.plan_batch(0, 1)
    assert plan is not None
    _, results = runner(coord, 1, client).run_tasks(plan, ROWS)
    during()
    return coord.complete_batch(plan, results)


def test_a_longer_timeout_rescues_the_batch_in_flight(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="extend", checkpoint_timeout_s=0.5)
    aborted: list[int] = []
    coord.on_timeout = aborted.append
    coord.start_watchdog(0.02)

    def extend_then_wait() -> None:
        coord.update_config(checkpoint_timeout_ms=30_000)
        # wall time must pass the old timeout (the watchdog thread reads the real clock)
        time.sleep(0.8)

    record = _slow_batch(coord, client, extend_then_wait)
    assert record.batch_id == 0 and aborted == []
    coord.close()


def test_a_shorter_timeout_aborts_the_batch_in_flight(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="shrink-t", checkpoint_timeout_s=30)
    aborted: list[int] = []
    coord.on_timeout = aborted.append

    def shrink() -> None:
        time.sleep(0.3)  # wall time the batch has run: more than the new timeout
        coord.update_config(checkpoint_timeout_ms=100)  # elapsed > new timeout: abort now
        assert aborted == [0]

    with pytest.raises(CheckpointTimedOut):
        _slow_batch(coord, client, shrink)
    assert coord.storage.batch_ids() == []
    # the re-run of the batch (after the abort) checkpoints normally with a fitting timeout
    coord.update_config(checkpoint_timeout_ms=30_000)
    assert runner(coord, 1, client).run_batch(0, ROWS) is not None
    assert coord.storage.batch_ids() == [0]
    coord.close()
