"""A real dstl-server process shared by the tests of a module, and a client of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client.client import ChangelogClient
from dstl_server.testing import ServerProcess


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One sidecar process per test module (file:// storage, stopped at the end)."""
    with ServerProcess(tmp_path_factory.mktemp("sidecar")) as proc:
        yield proc


@pytest.fixture
def client(sidecar: ServerProcess) -> Iterator[ChangelogClient]:
    with ChangelogClient(sidecar.address) as c:
        c.wait_ready()
        yield c


@pytest.fixture
def objects_dir(sidecar: ServerProcess) -> Path:
    """Where the sidecar stores objects."""
    return Path(sidecar.storage.removeprefix("file://"))
