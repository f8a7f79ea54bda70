"""The job as one vectorized function (``transform_batches``, Arrow frames, no pandas).

Called once per task and micro-batch with all the rows of the task's key-group
range and the state of exactly their keys: one hash aggregation of the rows,
one join with the state, two additions; no Python per key.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.vectorized import BatchInput, BatchOutput

ZERO = pa.scalar(0, pa.int64())


def count_sum(batch: BatchInput) -> BatchOutput:
    """count += rows of the key, total += their ``v``; emit and store the new pair."""
    counted = batch.rows.group_by("k").aggregate([("v", "count"), ("v", "sum")])
    joined = counted.join(batch.state.select(["k", "count", "total"]), "k", join_type="left outer")
    new = pa.table(
        {
            "k": joined["k"],
            "count": pc.add(pc.coalesce(joined["count"], ZERO), joined["v_count"]),
            "total": pc.add(pc.coalesce(joined["total"], ZERO), joined["v_sum"]),
        }
    )
    return BatchOutput(output=new, upserts=new)
