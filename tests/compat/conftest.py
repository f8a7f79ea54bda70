"""Fixtures of the compatibility suite: one Spark session and one sidecar for the whole package.

Package scope: every case of ``tests/compat`` runs in the same Spark session
(a session start costs 5-15 s) against the same sidecar process; both are
stopped after the package's last test, failures included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dstl_server.testing import ServerProcess
from tests.compat._engines import Outcomes

pytest.importorskip("pyspark")


@pytest.fixture(scope="package")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("compat-sidecar")) as proc:
        yield proc


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    """A local Spark session (``local[2]``, 2 shuffle partitions) for every case."""
    from tests.e2e._spark_job import session

    s = session()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="package")
def outcomes(
    spark: Any, sidecar: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Outcomes:
    """Each case's rows on both engines, run once for every test that compares a part of them."""
    return Outcomes(spark, sidecar.address, tmp_path_factory.mktemp("compat-runs"))
