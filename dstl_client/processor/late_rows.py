"""Late input rows on the task side: at or before the previous batch's watermark.

Shared by every task kind with event time (the processor's and the vectorized
engine's): the rule of :mod:`.times`, applied to one task's Arrow input. Pure
function, any thread.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.processor.times import BatchTimes


def split_late_rows(
    table: pa.Table | None, event_time_column: str | None, times: BatchTimes, late_rows: str
) -> tuple[pa.Table | None, int, int]:
    """``(table, dropped, passed)``: the late rows counted, and dropped unless
    ``late_rows`` is ``"pass"``; rows with a null event time are never late."""
    if table is None or not event_time_column or times.late_watermark_ms < 0:
        return table, 0, 0
    micros = pc.cast(table.column(event_time_column), pa.int64())
    late = pc.fill_null(pc.less_equal(micros, times.late_watermark_ms * 1000), False)
    n_late = pc.sum(late).as_py() or 0
    if late_rows == "drop":
        return table.filter(pc.invert(late)), n_late, 0
    return table, 0, n_late
