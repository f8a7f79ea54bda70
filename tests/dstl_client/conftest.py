"""Fixtures of the client tests: a client of the module's sidecar, Hypothesis kept out of the checkout.

Hypothesis writes ``.hypothesis/`` into the working directory (example
database, constants and unicode caches), the constants already while pytest
collects, so the home directory is moved to a temp dir when this conftest is
imported and removed when the session ends.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from dstl_client.client import ChangelogClient
from dstl_server.testing import ServerProcess

_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="dstl-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_HYPOTHESIS_HOME, ignore_errors=True)


@pytest.fixture
def client(sidecar: ServerProcess) -> Iterator[ChangelogClient]:
    with ChangelogClient(sidecar.address) as c:
        c.wait_ready()
        yield c


@pytest.fixture
def objects_dir(sidecar: ServerProcess) -> Path:
    """Where the sidecar stores objects."""
    return Path(sidecar.storage.removeprefix("file://"))
