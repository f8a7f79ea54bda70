"""What the user's batch function gets and returns (the vectorized API's contract).

``fn(batch: BatchInput) -> BatchOutput`` is called once per task and
micro-batch (one task is one key-group range), never per key. Tables are
``pyarrow.Table`` (``frame="arrow"``) or pandas ``DataFrame`` (``frame="pandas"``).
Values are immutable records: built and read on the task's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the column of the ``state`` table saying whether the key has (live) state
PRESENT = "present"
#: the time column of the ``expired``, ``timers`` and ``timer_deletes`` tables (ms, int64)
TIMESTAMP = "timestamp_ms"


@dataclass(frozen=True, slots=True)
class BatchInput:
    """One task's share of one micro-batch. Frozen.

    ``rows``: the batch's input rows of the task's key groups (all input
    columns, late rows dropped unless ``late_rows="pass"``). ``state``: one
    row per distinct key present in ``rows`` or ``expired``: the key
    column, the ``state_schema`` columns (null without state) and
    :data:`PRESENT` (``False``: no state yet, or expired by the TTL).
    ``expired``: the due timers (key column, :data:`TIMESTAMP`), empty when
    none. ``watermark_ms`` is ``None`` in a query without event time;
    ``processing_time_ms`` is ``-1`` in time mode ``"None"``.
    """

    rows: Any
    state: Any
    expired: Any
    batch_id: int
    watermark_ms: int | None
    processing_time_ms: int


@dataclass(slots=True)
class BatchOutput:
    """What the function returns; every field optional (``None``: nothing).

    ``output``: rows of ``output_schema`` to emit. ``upserts``: the key
    column and every ``state_schema`` column: the new state of those keys
    (of several rows of one key the last wins). ``deletes``: the key
    column: state removed (applied after the upserts). ``timers``: key
    column and :data:`TIMESTAMP`: timers to register; ``timer_deletes``: the
    same shape, timers to remove.
    """

    output: Any = None
    upserts: Any = None
    deletes: Any = None
    timers: Any = None
    timer_deletes: Any = None


#: the user's function: one call per task and micro-batch
BatchFunction = Callable[[BatchInput], BatchOutput]
