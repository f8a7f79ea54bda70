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

# The processor package first, whole: its ``transform_with_state`` dispatches a
# bounded input into this package (the one upward edge, named in the import
# contract), so it must be initialized before this package's modules import it.
import dstl_client.processor  # noqa: F401
from dstl_client.bounded.backend import KeyOrderError, SingleKeyBackend, as_keyed_backend
from dstl_client.bounded.dataframe import process_bounded, sorted_mode
from dstl_client.bounded.runner import (
    SortedKeyedRunner,
    SortedProcessorRunner,
    SortedStats,
    run_sorted,
    run_sorted_processor,
)

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
