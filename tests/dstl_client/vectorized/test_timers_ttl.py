"""Vectorized timers and TTL on an injected clock, against a real sidecar (processor semantics)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dstl_client.client import ChangelogClient
from dstl_client.core.errors import InvalidArgument
from dstl_client.vectorized import BatchInput, BatchOutput
from dstl_client.vectorized.spec import VectorSpec
from dstl_server.testing import ServerProcess
from tests.dstl_client.vectorized._harness import COUNT_SUM, INPUT, VectorHarness, coordinator

SEEN = pa.schema([("k", pa.int64()), ("count", pa.int64()), ("total", pa.int64())])


def spec(**kw: Any) -> VectorSpec:
    return VectorSpec(key="k", input_schema=INPUT, state_schema=COUNT_SUM, output_schema=SEEN, **kw)


def timers_fn(batch: BatchInput) -> BatchOutput:
    """Each key of the rows gets a timer 50 ms on (key 4's is deleted again); a fired timer
    is emitted as ``(k, -1, timestamp)``."""
    keys = pc.unique(batch.rows.column("k"))
    mine = keys.to_pylist()
    due = pa.array([batch.processing_time_ms + 50] * len(keys), pa.int64())
    expired = batch.expired
    out = pa.table(
        {
            "k": expired.column("k"),
            "count": pa.array([-1] * expired.num_rows, pa.int64()),
            "total": expired.column("timestamp_ms"),
        }
    )
    # the state table holds the timers' keys too (no state: not present)
    assert set(expired.column("k").to_pylist()) <= set(batch.state.column("k").to_pylist())
    assert not any(batch.state.column("present").to_pylist())
    return BatchOutput(
        output=out,
        timers=pa.table({"k": keys, "timestamp_ms": due}),
        timer_deletes=pa.table(  # key 4 of the rows: its timer deleted again
            {"k": pc.filter(keys, pc.equal(keys, 4)), "timestamp_ms": due[: int(4 in mine)]}
        ),
    )


def test_due_timers_fire_once_in_time_order_across_a_restore(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    times = {0: 1000, 1: 1100, 2: 1200, 3: 1300}
    h = VectorHarness(
        coordinator(tmp_path, sidecar.address, "timers"),
        timers_fn,
        client,
        spec(time_mode="ProcessingTime"),
        clock=times.__getitem__,
    )
    run = h.run_batch(0, [{"k": 1, "v": 0}, {"k": 2, "v": 0}, {"k": 4, "v": 0}])
    assert run is not None and run.output.num_rows == 0
    run = h.run_batch(1, [{"k": 3, "v": 0}])
    assert run is not None
    assert sorted(run.output.to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "count": -1, "total": 1050},
        {"k": 2, "count": -1, "total": 1050},
    ]
    assert run.stats.timers_fired == 2
    h.coordinator.close()
    shutil.rmtree(tmp_path / "state")  # restored from the DSTL, the timer index with it
    h = VectorHarness(
        coordinator(tmp_path, sidecar.address, "timers"),
        timers_fn,
        client,
        spec(time_mode="ProcessingTime"),
        clock=times.__getitem__,
        parallelism=3,
    )
    run = h.run_batch(2, [])
    assert run is not None
    assert run.output.to_pylist() == [{"k": 3, "count": -1, "total": 1150}]
    run = h.run_batch(3, [])
    assert run is not None and run.output.num_rows == 0
    h.coordinator.close()


def ttl_fn(batch: BatchInput) -> BatchOutput:
    """Emit each row key's state as the function sees it; rows with ``v == 1`` count up."""
    state = batch.state
    out = pa.table(
        {
            "k": state.column("k"),
            "count": pc.if_else(state.column("present"), state.column("count"), -1),
            "total": state.column("total"),
        }
    )
    bump = batch.rows.filter(pc.equal(batch.rows.column("v"), 1))
    keys = pc.unique(bump.column("k"))
    joined = pa.table({"k": keys}).join(state, "k")
    new = pa.table(
        {
            "k": joined.column("k"),
            "count": pc.add(pc.fill_null(joined.column("count"), 0), 1),
            "total": pa.array([batch.processing_time_ms] * joined.num_rows, pa.int64()),
        }
    )
    return BatchOutput(output=out, upserts=new)


def test_state_expires_at_the_processing_time_plus_ttl_and_is_cleaned_up(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    times = {0: 1000, 1: 1100, 2: 1200, 3: 1400}
    h = VectorHarness(
        coordinator(tmp_path, sidecar.address, "ttl"),
        ttl_fn,
        client,
        spec(time_mode="ProcessingTime", ttl_ms=150),
        clock=times.__getitem__,
        parallelism=1,
    )

    def seen(run: Any) -> dict[int, int]:
        return {r["k"]: r["count"] for r in run.output.to_pylist()}

    run = h.run_batch(0, [{"k": 1, "v": 1}, {"k": 2, "v": 1}])
    assert run is not None and seen(run) == {1: -1, 2: -1}
    run = h.run_batch(1, [{"k": 2, "v": 1}])  # key 2 lives on until 1250
    assert run is not None and seen(run) == {2: 1}
    run = h.run_batch(2, [{"k": 1, "v": 0}, {"k": 2, "v": 0}])  # key 1 expired at 1150
    assert run is not None and seen(run) == {1: -1, 2: 2}
    assert run.stats.ttl_evicted == 1
    run = h.run_batch(3, [{"k": 2, "v": 0}])
    assert run is not None and seen(run) == {2: -1}
    assert run.stats.ttl_evicted == 1
    h.coordinator.close()


def test_timers_need_a_time_mode(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    def fn(batch: BatchInput) -> BatchOutput:
        return BatchOutput(timers=pa.table({"k": [1], "timestamp_ms": [5]}))

    h = VectorHarness(coordinator(tmp_path, sidecar.address, "notime"), fn, client, spec())
    with pytest.raises(InvalidArgument, match="time mode"):
        h.run_batch(0, [{"k": 1, "v": 1}])
    h.coordinator.close()


def test_event_time_timers_fire_at_the_watermark(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    def fn(batch: BatchInput) -> BatchOutput:
        assert batch.watermark_ms == watermarks[batch.batch_id]
        keys = pc.unique(batch.rows.column("k"))
        at = pa.array([500] * len(keys), pa.int64())
        expired = batch.expired
        out = pa.table(
            {
                "k": expired.column("k"),
                "count": expired.column("timestamp_ms"),
                "total": [0] * expired.num_rows,
            },
            schema=SEEN,
        )
        return BatchOutput(output=out, timers=pa.table({"k": keys, "timestamp_ms": at}))

    watermarks = {0: 0, 1: 499, 2: 500}
    h = VectorHarness(
        coordinator(tmp_path, sidecar.address, "event"),
        fn,
        client,
        spec(time_mode="EventTime", event_time_column="ts"),
        watermark=watermarks.__getitem__,
    )
    assert h.run_batch(0, [{"k": 7, "v": 0}]) is not None
    run = h.run_batch(1, [])
    assert run is not None and run.output.num_rows == 0
    run = h.run_batch(2, [])
    assert run is not None and run.output.to_pylist() == [{"k": 7, "count": 500, "total": 0}]
    h.coordinator.close()
