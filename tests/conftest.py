"""Shared fixtures: real sidecars (in-process and as processes) on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from dstl_server.app import DstlServer
from dstl_server.testing import ServerProcess, running_server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[DstlServer]:
    """An in-process sidecar on a free loopback port, file:// under tmp_path."""
    async with running_server(tmp_path) as srv:
        yield srv


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    """A real dstl-server process on a free loopback port."""
    with ServerProcess(tmp_path / "proc") as proc:
        yield proc


pytest_plugins = ["tests.s3_fixtures"]
