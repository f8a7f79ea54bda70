"""The state reader on a real PySpark job: a retained checkpoint's state as a DataFrame."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.coordinator.storage import CheckpointMissing
from dstl_client.keygroups import key_group_for_key
from dstl_client.spark.state_reader import FORMAT, StateSpec, read_state
from dstl_client.state.serializers import INT64
from dstl_server.testing import ServerProcess
from tests.e2e._spark_job import AGG, MAX_P, agg, batch_rows, expected, write_input
from tests.e2e.test_spark_state import _start

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS, KEYS, BATCHES = 300, 60, 3
SERIALIZERS: dict[str, Any] = {
    "agg": AGG,
    "mods": StateSpec.map_state(INT64, INT64),
    "lowest": StateSpec.list_state(INT64),
}


def agg_more(key: Any, rows: list[dict[str, Any]], ctx: Any) -> Iterator[Any]:
    """:func:`agg`, plus a map state (rows per ``v % 3``) and a list state (3 lowest ``v``)."""
    mods = ctx.map_state("mods", INT64, INT64)
    lowest = ctx.list_state("lowest", INT64)
    for r in rows:
        mods.put(r["v"] % 3, (mods.get(r["v"] % 3) or 0) + 1)
    lowest.update(sorted(set(lowest.get()) | {r["v"] for r in rows})[:3])
    yield from agg(key, rows, ctx)


def expected_more(batches: int) -> dict[str, dict[str, Any]]:
    """What :func:`agg_more` leaves in state after ``batches`` batches."""
    out: dict[str, dict[str, Any]] = {}
    for b in range(batches):
        for k, v in batch_rows(b, ROWS, KEYS):
            s = out.setdefault(k, {"mods": {}, "lowest": []})
            s["mods"][v % 3] = s["mods"].get(v % 3, 0) + 1
            s["lowest"] = sorted({*s["lowest"], v})[:3]
    for k, total in expected(batches, ROWS, KEYS)[0].items():
        out[k]["agg"] = total
    return out


def decoded(rows: list[Any]) -> dict[str, dict[str, Any]]:
    """DataFrame rows (JSON text values) in the shape of :func:`expected_more`."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        assert r.key_group == key_group_for_key(r.key, MAX_P)
        s = out.setdefault(r.key, {"mods": {}})
        if r.state_name == "agg":
            assert r.state_kind == "value" and r.user_key is None
            s["agg"] = tuple(json.loads(r.value))
            assert AGG.dumps(s["agg"]) == r.value_bytes
        elif r.state_name == "mods":
            assert r.state_kind == "map" and INT64.dumps(json.loads(r.user_key)) == r.user_key_bytes
            s["mods"][json.loads(r.user_key)] = json.loads(r.value)
        else:
            assert (r.state_name, r.state_kind) == ("lowest", "list")
            s["lowest"] = json.loads(r.value)
    return out


def test_a_retained_checkpoint_of_a_spark_job_read_as_a_dataframe(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    write_input(tmp_path / "input", 0, BATCHES - 1, ROWS, KEYS)
    # materialized every batch: the records restore from parts and changelog segments
    q = _start(spark, tmp_path, sidecar, 2, fn=agg_more, materialize_interval_s=0)
    try:
        q.wait_for_batch(BATCHES - 1, timeout_s=120)
    finally:
        q.stop()
    ckpt = str(tmp_path / "ckpt")

    latest = read_state(
        spark, checkpoint_dir=ckpt, dstl_address=sidecar.address, serializers=SERIALIZERS
    )
    assert latest.columns == [
        "key_group",
        "key",
        "state_name",
        "state_kind",
        "user_key",
        "value",
        "user_key_bytes",
        "value_bytes",
    ]
    assert decoded(latest.collect()) == expected_more(BATCHES)
    # the older retained checkpoint (retain=2), read by three Spark tasks
    older = read_state(
        spark,
        checkpoint_dir=ckpt,
        batch_id=BATCHES - 2,
        dstl_address=sidecar.address,
        serializers=SERIALIZERS,
        partitions=3,
    )
    assert older.rdd.getNumPartitions() == 3
    assert decoded(older.collect()) == expected_more(BATCHES - 1)

    # the data source used directly, like Spark's statestore: raw bytes
    raw = (
        spark.read.format(FORMAT)
        .option("dstlAddress", sidecar.address)
        .option("keyGroups", "0-3,9")
        .load(ckpt)
        .collect()
    )
    assert raw and all(r.value is None and r.user_key is None for r in raw)
    typed = latest.where("key_group IN (0, 1, 2, 3, 9)").collect()

    def key(r: Any, kind: str | None) -> tuple[Any, ...]:
        return (r.key_group, r.key, r.state_name, kind, r.user_key_bytes, r.value_bytes)

    # without serializers only map entries know their kind
    want = {key(r, "map" if r.state_kind == "map" else None) for r in typed}
    assert {key(r, r.state_kind) for r in raw} == want and len(raw) == len(typed)

    # errors are raised before Spark plans anything
    with pytest.raises(CheckpointMissing, match=r"batch 0 .*retained ones are batches 1, 2"):
        read_state(spark, checkpoint_dir=ckpt, batch_id=0, dstl_address=sidecar.address)
    with pytest.raises(CheckpointMissing, match=r"operator 'other'.*operators are 'keyed'"):
        read_state(spark, checkpoint_dir=ckpt, operator_id="other", dstl_address=sidecar.address)
