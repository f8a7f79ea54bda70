"""Fixtures of the compatibility suite: every case run once, in the shared Spark session.

Package scope: every case of ``tests/compat`` runs in the test session's
Spark session (``tests/conftest.py``: a session start costs 10-40 s) against
one sidecar process of the package; the sidecar is stopped and the Spark
settings the cases changed are put back after the package's last test,
failures included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dstl_server.testing import ServerProcess
from tests._helpers import lent
from tests.compat._engines import Outcomes

pytest.importorskip("pyspark")


@pytest.fixture(scope="package")
def outcomes(spark_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcomes]:
    """Each case's rows on both engines, run once for every test that compares a part of them."""
    with (
        ServerProcess(tmp_path_factory.mktemp("compat-sidecar")) as sidecar,
        lent(spark_session) as spark,
    ):
        yield Outcomes(spark, sidecar.address, tmp_path_factory.mktemp("compat-runs"))
