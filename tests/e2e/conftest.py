"""End-to-end tests run real PySpark jobs: skipped where pyspark is missing.

Their ``sidecar`` (one per module) and ``spark`` (the session's shared Spark
session) come from ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
