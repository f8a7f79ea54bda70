"""End-to-end fixtures: a real sidecar process and one Spark session for the module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dstl_server.testing import ServerProcess

pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("sidecar")) as proc:
        yield proc


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local Spark session whose tasks may be retried (``local[2,4]``)."""
    from tests.e2e._spark_job import session

    s = session("2,4")
    try:
        yield s
    finally:
        s.stop()
