"""The store check when a sidecar starts, in-process, and how the CLI reports it.

* A store that refuses the sidecar (a probe error that trying again cannot
  fix: no such bucket, refused credentials) makes ``DstlServer.start`` raise
  a one-line :class:`ConfigError` after releasing what it opened; the CLI
  exits 2 with that line.
* A store that does not answer (a retryable error) is no reason to stop: the
  server starts with ``store_up`` False and health NOT_SERVING for the
  Changelog service (the overall health stays SERVING).
* A ``file://`` store fails the check on any error (a directory that cannot
  be written is a configuration error).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from dstl_client.core.errors import ConfigError, StorageError, TransientStorageError
from dstl_server import cli
from dstl_server.app import SERVICE_NAME, DstlServer
from dstl_server.settings import ServerSettings
from dstl_server.storage import LocalBlobStore
from dstl_server.testing import test_settings as settings_for
from tests.fakes import MemoryBlobStore

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class RefusingStore(MemoryBlobStore):
    """A store whose every probe fails with ``error``; counts ``close`` calls."""

    def __init__(self, error: StorageError) -> None:
        super().__init__()
        self.error = error
        self.closed = 0

    async def probe(self) -> None:
        raise self.error

    async def close(self) -> None:
        self.closed += 1


async def _health(server: DstlServer, service: str) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    response = await server.health.Check(request, None)  # type: ignore[arg-type]
    return int(response.status)


@pytest.mark.asyncio
async def test_a_refusing_store_stops_the_start(tmp_path: Path) -> None:
    store = RefusingStore(
        StorageError("probe s3://b/p/: NoSuchBucket The specified\nbucket", retryable=False)
    )
    server = DstlServer(settings_for(tmp_path, storage="s3://b/p"), store=store)
    with pytest.raises(ConfigError) as info:
        await server.start()
    assert info.value.message == (
        "setting storage='s3://b/p': the store refused us: "
        "probe s3://b/p/: NoSuchBucket The specified bucket"  # one line
    )
    assert store.closed == 1
    assert server.housekeeping.task is None  # no probe loop left behind


@pytest.mark.asyncio
async def test_an_unreachable_store_starts_not_serving(tmp_path: Path) -> None:
    store = RefusingStore(TransientStorageError("probe: connection refused"))
    server = DstlServer(settings_for(tmp_path), store=store)
    await server.start()
    try:
        assert not server.store_up
        assert await _health(server, SERVICE_NAME) == NOT_SERVING
        assert await _health(server, "") == SERVING
        assert server.metrics.store_up._value.get() == 0
    finally:
        await server.stop()


@pytest.mark.asyncio
async def test_a_store_that_answers_starts_serving(tmp_path: Path) -> None:
    server = DstlServer(settings_for(tmp_path), store=MemoryBlobStore())
    await server.start()
    try:
        assert server.store_up
        assert await _health(server, SERVICE_NAME) == SERVING
    finally:
        await server.stop()


def test_a_local_store_failing_its_probe_is_fatal(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "objects", fsync=False)
    assert store.fatal_at_start(TransientStorageError("cannot write"))
    assert MemoryBlobStore().fatal_at_start(StorageError("denied", retryable=False))
    assert not MemoryBlobStore().fatal_at_start(TransientStorageError("down"))


def test_the_probe_interval_reaches_the_housekeeping(tmp_path: Path) -> None:
    server = DstlServer(
        settings_for(tmp_path, store_probe_interval_s=0.25), store=MemoryBlobStore()
    )
    assert server.housekeeping.probe_interval_s == 0.25


def test_cli_exits_2_when_the_store_refuses_us(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import dstl_server.logs

    async def refused(settings: ServerSettings) -> int:
        raise ConfigError(f"setting storage={settings.storage!r}: the store refused us: denied")

    monkeypatch.setattr(cli, "serve", refused)
    monkeypatch.setattr(cli, "_fix_malloc_mmap_threshold", lambda: None)
    monkeypatch.setattr(dstl_server.logs, "setup_logging", lambda level: None)
    assert cli.main(["--storage", f"file://{tmp_path}", "--metrics-port", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"dstl-server: configuration error: setting storage='file://{tmp_path}': "
        "the store refused us: denied\n"
    )


def test_cli_version_and_bad_flags_return_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("dstl-server ")
    assert cli.main(["--max-writers", "x"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "dstl-server: configuration error: --max-writers='x': expected an integer "
        "(see dstl-server --help)\n"
    )
