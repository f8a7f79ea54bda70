"""The state reader on a real PySpark job: a retained checkpoint's state as a DataFrame."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.coordinator.schema_evolution import StateSchemaMismatch
from dstl_client.coordinator.storage import CheckpointMissing
from dstl_client.core.errors import ConfigError
from dstl_client.keygroups import key_group_for_key
from dstl_client.processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from dstl_client.spark.state_reader import FORMAT, StateSpec, read_state
from dstl_client.state.serializers import INT64
from dstl_server.testing import ServerProcess
from tests.e2e._spark_job import AGG, MAX_P, agg, batch_rows, expected, start_agg, write_input

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
    q = start_agg(spark, tmp_path, sidecar, 2, fn=agg_more, materialize_interval_s=0)
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


# ------------------------------------------------- a processor's recorded schemas

#: per batch: (user, page)
VISITS = [
    [("a", "p1"), ("a", "p2"), ("b", "p1")],
    [("a", "p1"), ("c", "p3")],
]
HOUR_MS = 3_600_000


class Tally(StatefulProcessor):
    """Per user: visits (value), visits per page (map), pages in order (list with a TTL)."""

    COUNT = "n long"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", self.COUNT)
        self.pages = handle.getMapState("pages", "page string", "n long")
        self.seen = handle.getListState("seen", "page string, at timestamp", HOUR_MS)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        import datetime

        from pyspark.sql import Row

        n = (self.count.get() or (0,))[0]
        for row in rows:
            n += 1
            old = self.pages.getValue((row.page,))
            self.pages.updateValue((row.page,), ((old[0] if old else 0) + 1,))
            at = datetime.datetime(2024, 1, 1, 12, n)
            self.seen.appendValue((row.page, at))
        self.count.update((n,))
        yield Row(user=key[0], n=n)


class TallyRetyped(Tally):
    """:class:`Tally` with its count declared as an int: it cannot read the checkpoint."""

    COUNT = "n int"


def start_tally(spark: Any, tmp: Path, sidecar: ServerProcess, processor: Any) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dstl_client.processor import transform_with_state

    inp = tmp / "visits"
    if not inp.exists():
        inp.mkdir()
        for b, rows in enumerate(VISITS):
            table = pa.table({"user": [u for u, _ in rows], "page": [p for _, p in rows]})
            pq.write_table(table, inp / f"part-{b:05d}.parquet")
            os.utime(inp / f"part-{b:05d}.parquet", (1_000 + b, 1_000 + b))
    events = (
        spark.readStream.schema("user string, page string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp))
    )
    return (
        transform_with_state(
            events.groupBy("user"),
            processor=processor,
            output_schema="user string, n long",
            time_mode="ProcessingTime",
            use_pandas=False,
            parallelism=2,
            max_parallelism=MAX_P,
            job_id="e2e-tally",
            dstl_address=sidecar.address,
            state_dir=str(tmp / "state"),
            orphan_grace_s=0,
        )
        .writeStream.format("memory")
        .queryName("tally")
        .option("checkpointLocation", str(tmp / "ckpt"))
        .start()
    )


@pytest.mark.timeout(600)
def test_a_processors_state_reads_typed_without_serializers_and_a_retyped_state_cannot_start(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    q = start_tally(spark, tmp_path, sidecar, Tally())
    try:
        q.wait_for_batch(len(VISITS) - 1, timeout_s=240)
    finally:
        q.stop()
    ckpt = str(tmp_path / "ckpt")
    counts = {"a": 3, "b": 1, "c": 1}
    pages = {("a", "p1"): 2, ("a", "p2"): 1, ("b", "p1"): 1, ("c", "p3"): 1}

    # one state read alone: typed columns, as Spark's statestore source gives them
    count = read_state(spark, checkpoint_dir=ckpt, dstl_address=sidecar.address, state_name="count")
    assert count.columns == ["key", "value", "partition_id", "key_group"]
    assert count.schema["value"].dataType.simpleString() == "struct<n:bigint>"
    rows = count.collect()
    assert {r.key.user: r.value.n for r in rows} == counts
    for r in rows:
        assert r.key_group == key_group_for_key(r.key.user, MAX_P)
        assert r.partition_id == r.key_group * 2 // MAX_P
    by_page = read_state(
        spark, checkpoint_dir=ckpt, dstl_address=sidecar.address, state_name="pages"
    ).collect()
    assert {(r.key.user, r.user_map_key.page): r.user_map_value.n for r in by_page} == pages
    seen = read_state(spark, checkpoint_dir=ckpt, dstl_address=sidecar.address, state_name="seen")
    assert seen.columns == ["key", "list_element", "partition_id", "key_group", "expiration_ms"]
    elements = seen.where("key.user = 'a'").collect()
    assert sorted((r.list_element.page, r.list_element.at.minute) for r in elements) == [
        ("p1", 1),
        ("p1", 3),
        ("p2", 2),
    ]
    assert all(r.expiration_ms > HOUR_MS for r in elements)

    # every state at once: decoded by the recorded schemas, as JSON text, no serializer
    every = read_state(spark, checkpoint_dir=ckpt, dstl_address=sidecar.address).collect()
    user_rows = [r for r in every if not r.state_name.startswith("$")]
    assert {r.key: json.loads(r.value) for r in user_rows if r.state_name == "count"} == {
        k: {"n": n} for k, n in counts.items()
    }
    assert all(r.value is not None for r in user_rows)
    # the data source used directly, like statestore with stateVarName
    direct = (
        spark.read.format(FORMAT)
        .option("dstlAddress", sidecar.address)
        .option("stateVarName", "pages")
        .load(ckpt)
    )
    assert direct.columns == ["key", "user_map_key", "user_map_value", "partition_id", "key_group"]
    assert len(direct.collect()) == len(pages)
    with pytest.raises(ConfigError, match=r"state 'nope' has no recorded schema.*'count'"):
        read_state(spark, checkpoint_dir=ckpt, dstl_address=sidecar.address, state_name="nope")

    # the operator CLI, as a process: typed values with no --serializer
    script = Path(sys.executable).with_name("dstl")
    done = subprocess.run(
        [str(script), "state", "get", "--key", "a", "--json", "--checkpoint-dir", ckpt],
        capture_output=True,
        text=True,
        env={**os.environ, "DSTL_ADDRESS": sidecar.address},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    states = json.loads(done.stdout)["states"]
    got = {(s["state"], json.dumps(s["user_key"])): s["value"] for s in states}
    assert got[("count", "null")] == {"n": 3}
    assert got[("pages", '{"page": "p1"}')] == {"n": 2}
    assert [e["page"] for e in got[("seen", "null")]] == ["p1", "p2", "p1"]
    assert got[("seen", "null")][0]["at"] == "2024-01-01T12:01:00"

    # a restart whose count is now an int fails before its first batch, naming the state
    records = sorted((tmp_path / "ckpt" / "dstl" / "checkpoints").glob("ck-*.json"))
    with pytest.raises(StateSchemaMismatch) as caught:
        start_tally(spark, tmp_path, sidecar, TallyRetyped())
    message = caught.value.message
    assert "state 'count'" in message
    assert "declared as value state struct<n: int>" in message
    assert "recorded as value state struct<n: bigint>" in message
    assert sorted((tmp_path / "ckpt" / "dstl" / "checkpoints").glob("ck-*.json")) == records
    assert not spark.streams.active
