"""The task side of the vectorized API on a real sidecar: count-and-sum, restore, rescale."""

from __future__ import annotations

import random
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
from tests.dstl_client.vectorized._harness import (
    COUNT_SUM,
    INPUT,
    OUTPUT,
    VectorHarness,
    coordinator,
)


def count_sum(batch: BatchInput) -> BatchOutput:
    """The contract's reference job: count += n rows, total += sum(v) per key; emit both."""
    rows: pa.Table = batch.rows
    agg = rows.group_by("k").aggregate([("v", "count"), ("v", "sum")])
    state: pa.Table = batch.state
    joined = agg.join(state, "k", join_type="left outer")
    count = pc.add(joined.column("v_count"), pc.fill_null(joined.column("count"), 0))
    total = pc.add(joined.column("v_sum"), pc.fill_null(joined.column("total"), 0))
    new = pa.table({"k": joined.column("k"), "count": count, "total": total})
    return BatchOutput(output=new, upserts=new)


def spec(**kw: Any) -> VectorSpec:
    return VectorSpec(
        key="k", input_schema=INPUT, state_schema=COUNT_SUM, output_schema=OUTPUT, **kw
    )


def batches(n: int, seed: int = 7) -> list[list[dict[str, int]]]:
    rnd = random.Random(seed)
    return [
        [{"k": rnd.randrange(60), "v": rnd.randrange(-50, 100)} for _ in range(200)]
        for _ in range(n)
    ]


def expected(all_batches: list[list[dict[str, int]]]) -> list[dict[tuple[int, int, int], int]]:
    """Per batch, the reference output rows (as a multiset)."""
    count: dict[int, int] = {}
    total: dict[int, int] = {}
    out = []
    for rows in all_batches:
        keys = []
        for r in rows:
            if r["k"] not in keys:
                keys.append(r["k"])
            count[r["k"]] = count.get(r["k"], 0) + 1
            total[r["k"]] = total.get(r["k"], 0) + r["v"]
        out.append({(k, count[k], total[k]): 1 for k in keys})
    return out


def as_set(table: pa.Table) -> dict[tuple[int, int, int], int]:
    return {(r["k"], r["count"], r["total"]): 1 for r in table.to_pylist()}


def test_count_sum_equals_the_reference_across_restore_and_rescale(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    data = batches(6)
    want = expected(data)
    h = VectorHarness(coordinator(tmp_path, sidecar.address, "vec"), count_sum, client, spec())
    for b in range(3):
        run = h.run_batch(b, data[b])
        assert run is not None
        assert as_set(run.output) == want[b]
        assert run.stats.keys == len(want[b])
    h.coordinator.close()
    shutil.rmtree(tmp_path / "state")  # the node's disk is gone: restore from the DSTL
    h = VectorHarness(
        coordinator(tmp_path, sidecar.address, "vec"), count_sum, client, spec(), parallelism=3
    )
    for b in range(3, 6):
        run = h.run_batch(b, data[b])
        assert run is not None
        assert as_set(run.output) == want[b], b
        assert any(r.stats.restored for r in run.results) or b > 3
    h.coordinator.close()


def test_a_batch_rerun_after_a_lost_record_is_applied_once(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    data = batches(3, seed=3)
    want = expected(data)
    h = VectorHarness(coordinator(tmp_path, sidecar.address, "rerun"), count_sum, client, spec())
    assert h.run_batch(0, data[0]) is not None
    plan = h.coordinator.plan_batch(1, 2)  # batch 1 runs, its record is never written
    assert plan is not None
    from dstl_client.processor.times import BatchTimes
    from dstl_client.vectorized.runner import run_batch

    run_batch(plan, 0, h.spec, count_sum, None, BatchTimes(), client=client)
    h.coordinator.end_batch(1)
    for b in (1, 2):
        run = h.run_batch(b, data[b])
        assert run is not None and as_set(run.output) == want[b]
    h.coordinator.close()


def test_pandas_frames_in_and_out(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    def fn(batch: BatchInput) -> BatchOutput:
        rows = batch.rows
        state = batch.state.set_index("k")
        agg = rows.groupby("k")["v"].agg(["count", "sum"])
        count = agg["count"] + state["count"].reindex(agg.index).fillna(0).astype("int64")
        total = agg["sum"] + state["total"].reindex(agg.index).fillna(0).astype("int64")
        new = count.rename("count").to_frame().assign(total=total).reset_index()
        return BatchOutput(output=new, upserts=new)

    data = batches(2, seed=5)
    want = expected(data)
    h = VectorHarness(
        coordinator(tmp_path, sidecar.address, "pandas"), fn, client, spec(frame="pandas")
    )
    for b in range(2):
        run = h.run_batch(b, data[b])
        assert run is not None and as_set(run.output) == want[b]
    h.coordinator.close()


def test_a_wrong_column_is_named(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    def fn(batch: BatchInput) -> BatchOutput:
        return BatchOutput(upserts=pa.table({"k": [1], "count": [1]}))

    h = VectorHarness(coordinator(tmp_path, sidecar.address, "bad"), fn, client, spec())
    with pytest.raises(InvalidArgument, match="'total'"):
        h.run_batch(0, [{"k": 1, "v": 2}])
    h.coordinator.close()


def test_a_key_without_rows_may_be_written_and_is_found_by_its_rows_later(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    def fn(batch: BatchInput) -> BatchOutput:
        state = batch.state
        out = state.select(["k", "count", "total"])
        if batch.batch_id == 0:  # key 999 has no row in this batch: its key group is computed
            return BatchOutput(upserts=pa.table({"k": [999], "count": [5], "total": [6]}))
        return BatchOutput(output=out)

    h = VectorHarness(
        coordinator(tmp_path, sidecar.address, "other"), fn, client, spec(), parallelism=1
    )
    assert h.run_batch(0, [{"k": 1, "v": 1}]) is not None
    run = h.run_batch(1, [{"k": 999, "v": 1}])
    assert run is not None and run.output.to_pylist() == [{"k": 999, "count": 5, "total": 6}]
    h.coordinator.close()
