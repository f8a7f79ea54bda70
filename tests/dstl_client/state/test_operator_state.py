"""Operator (non-keyed) list state: the snapshot codec, redistribution, and subtasks
against a real sidecar through rescales 2 -> 3 -> 1."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstl_client.batch.local import LocalRunner, partition_rows
from dstl_client.checkpoint.next_record import next_record
from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.core.errors import InvalidArgument
from dstl_client.state import INT64, STR
from dstl_client.state.api import KeyedContext
from dstl_client.state.operator_state import Lists, decode_snapshot, encode_snapshot, redistribute
from dstl_server.testing import ServerProcess
from tests.dstl_client.state._jobs import MAX_P, make_batches, make_coordinator

lists_strategy = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.tuples(st.sampled_from(["split", "union"]), st.lists(st.binary(max_size=12), max_size=8)),
    max_size=4,
)


@given(lists_strategy)
def test_a_snapshot_decodes_to_what_was_encoded(lists: Lists) -> None:
    assert decode_snapshot(encode_snapshot(lists)) == lists


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"XXXX\x00\x00\x00\x00", "bad magic"),
        (encode_snapshot({"a": ("split", [b"xyz"])})[:-1], "truncated"),
        (encode_snapshot({}) + b"!", "trailing"),
        # one list claiming 2^32-1 elements in a few bytes: refused before allocating
        (b"DOS1\x01\x00\x00\x00\x01\x00a\x00\xff\xff\xff\xff", "cannot fit"),
        (b"DOS1\x01\x00\x00\x00\x01\x00a\x07\x00\x00\x00\x00", "unknown mode"),
    ],
)
def test_bytes_that_are_not_a_snapshot_are_a_typed_error(data: bytes, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        decode_snapshot(data)


@given(
    st.lists(st.lists(st.binary(max_size=3), max_size=10), min_size=1, max_size=5),
    st.integers(1, 6),
)
def test_even_split_keeps_every_element_once_in_order_and_balanced(
    old: list[list[bytes]], parallelism: int
) -> None:
    lists = [{"s": ("split", elements)} for elements in old]
    new = [
        redistribute(lists, i, parallelism).get("s", ("split", []))[1] for i in range(parallelism)
    ]
    assert [e for part in new for e in part] == [e for part in old for e in part]
    assert max(map(len, new)) - min(map(len, new)) <= 1


def test_union_gives_every_subtask_every_element() -> None:
    old: list[Lists] = [{"u": ("union", [b"a"])}, {"u": ("union", [b"b", b"c"])}]
    for i in range(3):
        assert redistribute(old, i, 3) == {"u": ("union", [b"a", b"b", b"c"])}


def test_a_list_written_in_two_modes_is_refused() -> None:
    old: list[Lists] = [{"x": ("union", [b"a"])}, {"x": ("split", [b"b"])}]
    with pytest.raises(InvalidArgument, match="both"):
        redistribute(old, 0, 2)


# --------------------------------------------------------- against a sidecar
def ids_and_marks(key: Any, rows: list[dict[str, Any]], ctx: KeyedContext) -> Any:
    """Every row's ``v`` into the subtask's split list; one mark per batch into a union list."""
    ctx.operator_list_state("ids", INT64, "split").add_all(r["v"] for r in rows)
    marks = ctx.operator_list_state("marks", STR, "union")
    mark = f"b{ctx.batch_id}"
    if mark not in marks.get():
        marks.add(mark)
    return None


def untouched(key: Any, rows: list[dict[str, Any]], ctx: KeyedContext) -> Any:
    """A batch whose function never asks for its operator state."""
    return None


def recorded_lists(record: CheckpointRecord, client: ChangelogClient) -> dict[int, Lists]:
    return {
        i: decode_snapshot(b"".join(d for _kg, _sqn, d in client.read_changes(h)))
        for i, h in record.operator_state
    }


def run(
    coord: CheckpointCoordinator, client: ChangelogClient, fn: Any, batch: int, p: int, rows: Any
) -> CheckpointRecord:
    plan = coord.plan_batch(batch, p)
    assert plan is not None
    _, results = LocalRunner(
        coord, fn, key=lambda r: r["k"], parallelism=p, client=client
    ).run_tasks(plan, rows)
    return coord.complete_batch(plan, results)


def test_operator_lists_survive_rescale_2_3_1_split_evenly_or_united(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    batches = make_batches(6, rows=80, keys=30)
    coord = make_coordinator(tmp_path, sidecar.address, job_id="opstate")
    added: Counter[int] = Counter()
    before: dict[int, Lists] = {}
    for b, rows in enumerate(batches):
        p = 2 if b < 2 else 3 if b < 4 else 1
        fn = untouched if b == 4 else ids_and_marks
        record = run(coord, client, fn, b, p, rows)
        got = recorded_lists(record, client)
        assert sorted(got) == list(range(p))  # every subtask has its lists in the record
        if fn is ids_and_marks:
            added.update(r["v"] for r in rows)
        # nothing lost or duplicated by a rescale (even split), whoever touched the state
        assert Counter(v for lists in got.values() for v in lists["ids"][1]) == {
            INT64.dumps(v): n for v, n in added.items()
        }
        if b == 2:  # 2 -> 3: old lists cut evenly, then this batch's rows appended in order
            routed = partition_rows(rows, lambda r: r["k"], 3, MAX_P)
            for i in range(3):
                share = redistribute(list(before.values()), i, 3)["ids"][1]
                mine = [INT64.dumps(r["v"]) for key_rows in routed[i].values() for r in key_rows]
                assert got[i]["ids"] == ("split", share + mine)
                # union: every element of every old list (duplicates too), plus this batch's
                union = [m for i_old in sorted(before) for m in before[i_old]["marks"][1]]
                assert got[i]["marks"] == ("union", [*union, b"b2"])
        if b == 3:  # unchanged parallelism: each subtask kept its own list (no union again)
            assert all(got[i]["marks"][1] == [*before[i]["marks"][1], b"b3"] for i in range(3))
        before = got
    # the untouched rescale batch (3 -> 1) still rewrote the lists for the new subtask
    assert coord.latest is not None and coord.latest.parallelism == 1
    final = recorded_lists(coord.latest, client)[0]
    # the union of the three subtasks' lists (b0 twice in each, from the first union)
    assert Counter(final["marks"][1])[b"b0"] == 6


def test_a_rescaled_record_needs_every_subtask_to_rewrite_its_lists(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    coord = make_coordinator(tmp_path, sidecar.address, job_id="opstate-strict")
    rows = make_batches(1, rows=20, keys=5)[0]
    first = run(coord, client, ids_and_marks, 0, 2, rows)
    assert first.operator_state
    plan = coord.plan_batch(1, 3)
    assert plan is not None
    _, results = LocalRunner(
        coord, ids_and_marks, key=lambda r: r["k"], parallelism=3, client=client
    ).run_tasks(plan, [])
    without = [r.__class__(**{**_fields(r), "op_state": None}) for r in results]
    with pytest.raises(InvalidArgument, match="rescale"):
        next_record(
            first,
            job_id="opstate-strict",
            operator_id=first.operator_id,
            batch_id=1,
            max_parallelism=MAX_P,
            parallelism=3,
            results=without,
        )


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}
