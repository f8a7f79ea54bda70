"""PySpark integration: keyed stateful processing of streaming DataFrames on the DSTL.

:mod:`.keyed` (``process_keyed``), :mod:`.chain` (``process_chain``: keyed
operators chained in one query), :mod:`.task` (the executor side of
``fn(key, rows, ctx)``), :mod:`.state_reader` (``read_state``: a retained
checkpoint's state as a DataFrame; imported on first use, as it loads
``pyspark``). ``KeyedOptions``, ``DstlQuery`` and ``ChainQuery`` are
:mod:`dstl_client.batch`'s (the batch cycle every API shares), re-exported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dstl_client.batch.options import KeyedOptions, default_job_id
from dstl_client.batch.query import ChainQuery, DstlQuery
from dstl_client.spark.chain import KeyedStage, process_chain
from dstl_client.spark.keyed import process_keyed

if TYPE_CHECKING:
    from dstl_client.spark.state_reader import StateRow as StateRow
    from dstl_client.spark.state_reader import StateSpec as StateSpec
    from dstl_client.spark.state_reader import iter_state_rows as iter_state_rows
    from dstl_client.spark.state_reader import read_state as read_state

_STATE_READER = ("StateRow", "StateSpec", "iter_state_rows", "read_state")

__all__ = [
    "ChainQuery",
    "DstlQuery",
    "KeyedOptions",
    "KeyedStage",
    "default_job_id",
    "process_chain",
    "process_keyed",
    *_STATE_READER,
]


def __getattr__(name: str) -> Any:
    if name not in _STATE_READER:
        raise AttributeError(name)
    return getattr(importlib.import_module("dstl_client.spark.state_reader"), name)
