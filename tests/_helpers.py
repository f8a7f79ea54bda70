"""What test packages share besides fixtures: lending the one Spark session."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def lent(spark: Any) -> Iterator[Any]:
    """``spark`` for a while; after it, no query it started runs and its SQL settings are
    back (a setting it changed or unset is set again, one it added is unset).

    Threads: the test thread (pytest's fixtures)."""
    before = dict(spark.conf.getAll)
    try:
        yield spark
    finally:
        for query in spark.streams.active:
            query.stop()
        after = dict(spark.conf.getAll)
        for key in before.keys() | after.keys():
            if before.get(key) != after.get(key) and spark.conf.isModifiable(key):
                if key in before:
                    spark.conf.set(key, before[key])
                else:
                    spark.conf.unset(key)
