"""Dynamic checkpoint configuration: the REST endpoint and in-flight timeouts."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.client import ChangelogClient
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.metadata import FileMetadataStore, MetadataStoreError
from dstl_client.coordinator.overrides import ConfigOverrides
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.coordinator.watchdog import CheckpointTimedOut
from dstl_client.core.errors import ConfigError
from dstl_server.testing import ServerProcess
from tests.dstl_client.coordinator._helpers import ROWS
from tests.dstl_client.state._jobs import make_coordinator, runner
from tests.fakes import ManualClock


@pytest.fixture
def rest() -> Iterator[CheckpointConfigServer]:
    server = CheckpointConfigServer()
    try:
        yield server
    finally:
        server.close()


def call(
    server: CheckpointConfigServer,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}", data=data, method=method, headers=headers or {}
    )
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
        {"checkpointInterval": 50},  # below the minimum
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
    clock = ManualClock()
    coord = make_coordinator(
        tmp_path, sidecar.address, job_id="extend", checkpoint_timeout_s=0.5, clock=clock
    )
    aborted: list[int] = []
    coord.on_timeout = aborted.append
    coord.start_watchdog(0.02)

    def extend_then_wait() -> None:
        coord.update_config(checkpoint_timeout_ms=30_000)
        clock.advance(0.8)  # past the old timeout (the watchdog thread reads this clock)

    record = _slow_batch(coord, client, extend_then_wait)
    assert record.batch_id == 0 and aborted == []
    coord.close()


def test_a_shorter_timeout_aborts_the_batch_in_flight(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    clock = ManualClock()
    coord = make_coordinator(
        tmp_path, sidecar.address, job_id="shrink-t", checkpoint_timeout_s=30, clock=clock
    )
    aborted: list[int] = []
    coord.on_timeout = aborted.append

    def shrink() -> None:
        clock.advance(0.3)  # the time the batch has run: more than the new timeout
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


def test_every_answer_is_json_and_get_says_where_each_value_came_from(
    tmp_path: Path, sidecar: ServerProcess, rest: CheckpointConfigServer
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="src", checkpoint_timeout_s=60)
    rest.register(coord)
    for path in ("/jobs/src/checkpoints/configuration", "/jobs/src/checkpoints/config"):
        status, doc = call(rest, "GET", path)
        assert status == 200
        assert doc["sources"] == {
            "checkpointInterval": "default",
            "checkpointTimeout": "job config",
            "materializationInterval": "job config",
        }
    assert (
        call(rest, "PATCH", "/jobs/src/checkpoints/config", {"checkpointTimeout": 9000})[0] == 200
    )
    status, doc = call(rest, "GET", "/jobs/src/checkpoints/configuration")
    assert doc["sources"]["checkpointTimeout"] == "override" and doc["checkpointTimeout"] == 9000
    status, doc = call(rest, "POST", "/jobs/src/checkpoints/configuration", {})
    assert status == 405 and "error" in doc
    status, doc = call(rest, "GET", "/no/such/route")
    assert status == 404 and "error" in doc
    coord.close()


def test_a_new_interval_is_persisted_then_handed_to_the_query(
    tmp_path: Path, sidecar: ServerProcess, rest: CheckpointConfigServer
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="ival")
    switched: list[float] = []
    coord.on_interval_change = switched.append
    rest.register(coord)
    status, doc = call(
        rest, "PATCH", "/jobs/ival/checkpoints/configuration", {"checkpointInterval": 2500}
    )
    assert status == 200 and doc["checkpointInterval"] == 2500
    assert switched == [2.5] and coord.config.checkpoint_interval_s == 2.5
    # the same value again is no switch
    call(rest, "PATCH", "/jobs/ival/checkpoints/configuration", {"checkpointInterval": 2500})
    assert switched == [2.5]
    coord.close()
    again = make_coordinator(tmp_path, sidecar.address, job_id="ival")
    assert again.config.checkpoint_interval_s == 2.5  # a restarted driver applies it
    assert again.effective_config()["sources"]["checkpointInterval"] == "override"
    again.close()


def test_off_loopback_the_endpoint_needs_a_token_and_checks_it(
    tmp_path: Path, sidecar: ServerProcess
) -> None:
    with pytest.raises(ConfigError, match="token"):
        CheckpointConfigServer(host="0.0.0.0")  # refused before anything binds
    server = CheckpointConfigServer(token="s3cret")  # a token is checked on loopback too
    try:
        coord = make_coordinator(tmp_path, sidecar.address, job_id="tok")
        server.register(coord)
        status, doc = call(server, "GET", "/jobs/tok/checkpoints/configuration")
        assert status == 401 and "token" in doc["error"]
        status, doc = call(
            server,
            "GET",
            "/jobs/tok/checkpoints/configuration",
            headers={"Authorization": "Bearer s3cret"},
        )
        assert status == 200 and doc["jobId"] == "tok"
        coord.close()
    finally:
        server.close()


class FailingPuts(FileMetadataStore):
    """A metadata store whose writes fail (the store is down): for the failure table."""

    def put(self, name: str, data: bytes) -> None:
        raise MetadataStoreError(f"cannot write {name}: the store is down", retryable=True)


def test_failure_table_crash_before_persist_and_after_persist_before_apply(
    tmp_path: Path, sidecar: ServerProcess, rest: CheckpointConfigServer
) -> None:
    # Row 1: the persist fails (or the driver dies before it): the caller gets an
    # error, nothing is applied, and a restarted driver has the old value.
    cfg = CoordinatorConfig(
        job_id="table",
        checkpoint_dir=str(tmp_path / "ckpt"),
        dstl_address=sidecar.address,
        state_dir=str(tmp_path / "state"),
        checkpoint_timeout_s=60,
        fsync=False,
    )
    down = CheckpointCoordinator(cfg, metadata=FailingPuts(tmp_path / "ckpt" / "dstl", fsync=False))
    down.start()
    rest.register(down)
    status, doc = call(
        rest, "PATCH", "/jobs/table/checkpoints/configuration", {"checkpointTimeout": 5000}
    )
    assert status == 503 and "not persisted" in doc["error"]
    assert down.config.checkpoint_timeout_s == 60
    down.close()
    rest.unregister("table")
    again = make_coordinator(tmp_path, sidecar.address, job_id="table", checkpoint_timeout_s=60)
    assert again.config.checkpoint_timeout_s == 60
    # Row 2: persisted, then the driver died before applying it: a restart applies it.
    overrides = ConfigOverrides(again.metadata, again.config.overrides_name)
    overrides.update(again.config, {"checkpointTimeout": 7000})  # persisted, never applied
    assert again.config.checkpoint_timeout_s == 60
    again.close()
    restarted = make_coordinator(tmp_path, sidecar.address, job_id="table", checkpoint_timeout_s=60)
    assert restarted.config.checkpoint_timeout_s == 7.0
    restarted.close()
