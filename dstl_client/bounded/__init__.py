"""Sorted mode for bounded input: keyed state without a store, a changelog or checkpoints.

Flink's FLIP-140 ("sorted inputs for stateful operators in BATCH mode") on
dstl: a bounded input is sorted by key, a keyed operator sees each key once
and in order, so its state needs no random-access backend and no
checkpoints. The state of the current key lives in a dict and is dropped
when the key ends; timers fire at the end of each key.

* :mod:`.backend`: :class:`SingleKeyBackend`, the state backend of the current
  key only (the methods the state classes call on the keyed backend), and
  :class:`KeyOrderError` (a key out of order or again, or a key switch by
  user code).
* :mod:`.runner`: the engine-neutral runners over ``(key, rows)`` in key
  order: :func:`run_sorted` (``fn(key, rows, ctx)``) and
  :func:`run_sorted_processor` (a ``StatefulProcessor``, timers at key end).
* :mod:`.task`: Spark's ``mapInArrow`` side (key runs found in Arrow, streamed).
* :mod:`.dataframe`: :func:`process_bounded` (the DataFrame entry point) and
  :func:`sorted_mode` (``df.isStreaming`` or an explicit ``execution_mode``).

The Spark parts import PySpark only when called.
"""

from typing import TYPE_CHECKING, Any

from dstl_client.bounded.backend import KeyOrderError, SingleKeyBackend, as_keyed_backend
from dstl_client.bounded.runner import (
    SortedKeyedRunner,
    SortedProcessorRunner,
    SortedStats,
    run_sorted,
    run_sorted_processor,
)

if TYPE_CHECKING:
    from dstl_client.bounded.dataframe import process_bounded as process_bounded
    from dstl_client.bounded.dataframe import sorted_mode as sorted_mode

__all__ = [
    "KeyOrderError",
    "SingleKeyBackend",
    "SortedKeyedRunner",
    "SortedProcessorRunner",
    "SortedStats",
    "as_keyed_backend",
    "process_bounded",
    "run_sorted",
    "run_sorted_processor",
    "sorted_mode",
]

_DATAFRAME = ("process_bounded", "sorted_mode")


def __getattr__(name: str) -> Any:
    if name not in _DATAFRAME:
        raise AttributeError(name)
    from dstl_client.bounded import dataframe

    return getattr(dataframe, name)
