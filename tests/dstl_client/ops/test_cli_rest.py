"""``dstl config`` = the driver's REST endpoint: every field the PATCH accepts, the
bearer token from the environment or a file, and the endpoint's answers as one-line
errors (exit 2: the command is wrong, exit 1: the driver cannot do it now).

A real :class:`CheckpointConfigServer` (the one the driver runs) in this process,
with a real coordinator on a real sidecar.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.metadata import FileMetadataStore, MetadataStoreError
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.ops.tokens import MAX_TOKEN_BYTES
from dstl_server.testing import ServerProcess
from tests.dstl_client.ops._helpers import Job, dstl

TOKEN = "cfg-Tok3n-for-the-driver-endpoint"


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DSTL_REST_URL", "DSTL_CONFIG_TOKEN", "DSTL_TOKEN", "DSTL_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def rest() -> Iterator[CheckpointConfigServer]:
    """The driver's endpoint with a token (as off loopback), on loopback."""
    server = CheckpointConfigServer(token=TOKEN)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def coord(tmp_path: Path, sidecar: ServerProcess) -> Iterator[CheckpointCoordinator]:
    c = Job(tmp_path, sidecar.address, "cli-rest").coordinator(checkpoint_timeout_s=60)
    try:
        yield c
    finally:
        c.close()


def only_the_driver(rest: CheckpointConfigServer, job_id: str = "cli-rest") -> list[str]:
    """``--rest-url`` and ``--job-id``: nothing about the metadata or a sidecar."""
    return ["--rest-url", f"http://127.0.0.1:{rest.port}", "--job-id", job_id]


def test_config_set_changes_every_field_the_rest_accepts_with_only_the_url_and_job_id(
    rest: CheckpointConfigServer,
    coord: CheckpointCoordinator,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    switched: list[float] = []
    coord.on_interval_change = switched.append
    rest.register(coord)
    monkeypatch.setenv("DSTL_CONFIG_TOKEN", TOKEN)
    r = dstl(
        "config",
        "set",
        "checkpointInterval=1.5s",
        "checkpoint-timeout=10min",
        "materializationInterval=500ms",
        "--json",
        *only_the_driver(rest),
    )
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["checkpointInterval"] == 1500 and doc["checkpointTimeout"] == 600_000
    assert doc["materializationInterval"] == 500
    assert doc["sources"] == dict.fromkeys(doc["sources"], "override")
    assert switched == [1.5]  # the running query is told, as a curl PATCH tells it
    assert coord.config.checkpoint_timeout_s == 600 and coord.config.materialize_interval_s == 0.5
    # plain milliseconds, and hours; the token from a file (which wins over the variable)
    monkeypatch.setenv("DSTL_CONFIG_TOKEN", "not-the-token")
    token_file = tmp_path / "config-token"
    token_file.write_text(TOKEN + "\n")
    r = dstl(
        "config",
        "set",
        "checkpointInterval=2500",
        "checkpointTimeout=2h",
        "--config-token-file",
        str(token_file),
        *only_the_driver(rest),
    )
    assert r.code == 0, r.err
    assert switched == [1.5, 2.5] and coord.config.checkpoint_timeout_s == 7200
    # the table: each setting with its value and where it came from
    got = dstl("config", "get", "--config-token-file", str(token_file), *only_the_driver(rest))
    assert got.code == 0, got.err
    rows = {line.split()[0]: line.split() for line in got.out.splitlines() if line.strip()}
    assert rows["checkpointInterval"] == ["checkpointInterval", "2500", "(2500ms)", "override"]
    assert rows["checkpointTimeout"] == ["checkpointTimeout", "7200000", "(2h)", "override"]
    assert rows["jobId:"] == ["jobId:", "cli-rest"]


def test_the_endpoints_refusals_are_one_line_errors_with_exit_2_or_1(
    rest: CheckpointConfigServer,
    coord: CheckpointCoordinator,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    sidecar: ServerProcess,
) -> None:
    rest.register(coord)
    where = only_the_driver(rest)

    def refused(*argv: str, code: int) -> str:
        r = dstl("config", *argv)
        assert r.code == code, (argv, r)
        assert r.out == "" and len(r.err.splitlines()) == 1, r.err
        assert r.err.startswith("dstl: error: ") and "Traceback" not in r.err
        assert TOKEN not in r.err
        return r.err

    # 401: no token, a wrong one; the hint names where the token goes
    err = refused("get", *where, code=2)
    assert "HTTP 401" in err and "none was given" in err and "$DSTL_CONFIG_TOKEN" in err
    monkeypatch.setenv("DSTL_CONFIG_TOKEN", "wrong-token")
    err = refused("set", "checkpointTimeout=5s", *where, code=2)
    assert "HTTP 401" in err and "was refused" in err and "--config-token-file" in err
    assert "wrong-token" not in err
    monkeypatch.setenv("DSTL_CONFIG_TOKEN", TOKEN)
    # 400: the endpoint judges the range, and the CLI says what it said
    err = refused("set", "checkpointInterval=50ms", *where, code=2)
    assert "HTTP 400" in err and "checkpointInterval" in err and "100" in err
    # 404: an unknown job
    err = refused("get", *only_the_driver(rest, "nope"), code=2)
    assert "HTTP 404" in err and "unknown job 'nope'" in err and "--job-id" in err
    # 409: another update in progress: try again (exit 1)
    with coord.config_update_lock:
        err = refused("set", "checkpointTimeout=9s", *where, code=1)
    assert "HTTP 409" in err and "in progress" in err and "try again" in err
    assert coord.config.checkpoint_timeout_s == 60  # nothing applied by any of them
    # 503: the update could not be persisted, nothing changed (exit 1)
    cfg = CoordinatorConfig(
        job_id="down",
        checkpoint_dir=str(tmp_path / "down"),
        dstl_address=sidecar.address,
        state_dir=str(tmp_path / "down-state"),
        fsync=False,
    )
    down = CheckpointCoordinator(cfg, metadata=FailingPuts(tmp_path / "down" / "dstl", fsync=False))
    down.start()
    try:
        rest.register(down)
        err = refused("set", "checkpointTimeout=5s", *only_the_driver(rest, "down"), code=1)
        assert "HTTP 503" in err and "not persisted" in err
    finally:
        down.close()
    # no one listening (exit 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the connection is refused
        err = refused("get", "--rest-url", f"http://127.0.0.1:{port}", "--job-id", "j", code=1)
    assert "refused" in err.lower()


class FailingPuts(FileMetadataStore):
    """A metadata store whose writes fail (the store is down)."""

    def put(self, name: str, data: bytes) -> None:
        raise MetadataStoreError(f"cannot write {name}: the store is down", retryable=True)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("checkpointInterval", "give NAME=VALUE"),
        ("checkpointInterval=", "a duration"),
        ("checkpointInterval=ten", "a duration"),
        ("checkpointInterval=-5s", "a duration"),
        ("checkpointInterval=5 weeks", "a duration"),
        ("checkpointInterval=1.5ms", "whole milliseconds"),
        ("checkpointInterval=" + "9" * 40, "a duration"),
        ("retainedCheckpoints=3", "checkpointInterval, checkpointTimeout, materializationInterval"),
    ],
)
def test_a_setting_the_cli_cannot_read_is_refused_before_any_call(setting: str, says: str) -> None:
    # a URL nobody serves: a refusal here means no call was made
    r = dstl("config", "set", setting, "--rest-url", "http://127.0.0.1:9", "--job-id", "j")
    assert r.code == 2 and says in r.err and len(r.err.splitlines()) == 1, r.err


def test_config_needs_a_url_and_a_job_and_a_readable_token(tmp_path: Path) -> None:
    r = dstl("config", "get", "--job-id", "j")
    assert r.code == 2 and "--rest-url" in r.err and "DSTL_REST_URL" in r.err
    r = dstl("config", "get", "--rest-url", "http://127.0.0.1:9")
    assert r.code == 2 and "--job-id" in r.err
    url = ["--rest-url", "http://127.0.0.1:9", "--job-id", "j"]
    empty, big, two = tmp_path / "empty", tmp_path / "big", tmp_path / "two"
    empty.write_text("\n")
    big.write_text("x" * (MAX_TOKEN_BYTES + 1))
    two.write_text("first\nsecond\n")
    for path, says in (
        (tmp_path / "missing", "cannot read"),
        (empty, "empty"),
        (big, f"longer than {MAX_TOKEN_BYTES} bytes"),
        (two, "one line"),
    ):
        r = dstl("config", "get", "--config-token-file", str(path), *url)
        assert r.code == 2 and "--config-token-file" in r.err and says in r.err, r.err
        assert "second" not in r.err
    # a token is never a flag: the old spelling is refused, its value not echoed
    r = dstl("config", "get", "--config-token", "s3cret-value", *url)
    assert r.code == 2 and "DSTL_CONFIG_TOKEN" in r.err and "--config-token-file" in r.err
    assert "s3cret-value" not in r.err
