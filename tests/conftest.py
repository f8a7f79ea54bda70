"""Shared fixtures: real sidecars (in-process and as processes) on loopback, one Spark session.

``sidecar`` is one ``dstl-server`` process per test module (file:// storage).
``spark`` is the session's one local Spark session, lent to a module: a Spark
start costs 10-40 s, so every module that runs Spark in this process shares
it, and what a module changes of it (SQL settings, queries left running) is
undone after the module's last test.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import settings

from dstl_server.app import DstlServer
from dstl_server.testing import ServerProcess, running_server
from tests._helpers import lent

# Hypothesis' per-example deadline is a timing assertion: on two cores shared with Spark
# and sidecar processes one example may take 10x another. Speed is the benchmarks' to
# check (CONTRIBUTING.md), so the examples run without a deadline.
settings.register_profile("dstl", deadline=None)
settings.load_profile("dstl")


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[DstlServer]:
    """An in-process sidecar on a free loopback port, file:// under tmp_path."""
    async with running_server(tmp_path) as srv:
        yield srv


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    """A real dstl-server process on a free loopback port."""
    with ServerProcess(tmp_path / "proc") as proc:
        yield proc


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One sidecar process per test module (file:// storage, stopped at the end)."""
    with ServerProcess(tmp_path_factory.mktemp("sidecar")) as proc:
        yield proc


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """The test session's local Spark session (``local[2,4]``: a failed task is retried),
    started on first use and stopped after the last test; modules take it as ``spark``."""
    pytest.importorskip("pyspark")
    from tests.e2e._spark_job import session

    s = session("2,4")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def spark(spark_session: Any) -> Iterator[Any]:
    """The shared Spark session for one module (see :func:`lent`)."""
    with lent(spark_session) as s:
        yield s


pytest_plugins = ["tests.s3_fixtures"]

#: fixtures that start SeaweedFS or Spark, and the mark a test using one must carry
#: (``make test-fast`` deselects ``s3``, ``spark`` and ``slow``)
_MARK_OF_FIXTURE = {"weed_s3": "s3", "weed_s3_tls": "s3", "spark_session": "spark"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse the run when a test takes a SeaweedFS or Spark fixture without its mark
    (one that asks for ``weed_s3`` only while running fails then: ``tests/s3_fixtures.py``)."""
    unmarked = [
        f"{item.nodeid}: uses {fixture} without @pytest.mark.{mark}"
        for item in items
        for fixture, mark in _MARK_OF_FIXTURE.items()
        if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(mark) is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests without the mark their fixtures need:\n" + "\n".join(unmarked)
        )


@pytest.fixture(params=["unary", "stream"])
def transport(request: pytest.FixtureRequest) -> str:
    """A test taking it runs once per client transport (``ChangelogClient(transport=...)``)."""
    return str(request.param)


class _AsyncioErrors(logging.Handler):
    """What asyncio reports through its logger rather than as a warning: a task whose
    exception nobody retrieved, a task destroyed while pending, a failing callback."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(self.format(record))

    def take(self) -> list[str]:
        messages, self.messages = self.messages, []
        return messages


_asyncio_errors = _AsyncioErrors()
logging.getLogger("asyncio").addHandler(_asyncio_errors)


@pytest.fixture(autouse=True)
def no_asyncio_errors() -> Iterator[None]:
    """Fail a test after which asyncio logged an error (its loop's exception handler).

    A task freed only by the garbage collector is reported when that runs, during a
    later test or at the end of the session (the message names its coroutine).
    """
    yield
    messages = _asyncio_errors.take()
    assert not messages, "asyncio reported:\n" + "\n\n".join(messages)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    gc.collect()
    messages = _asyncio_errors.take()
    if messages:
        print("\nasyncio reported after the last test:\n" + "\n\n".join(messages))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
