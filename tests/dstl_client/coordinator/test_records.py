"""Checkpoint records, the registry and the record store (no sidecar needed)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from dstl_client.checkpoint.messages import MatResult, TaskResult
from dstl_client.checkpoint.next_record import next_record
from dstl_client.checkpoint.records import (
    NO_BATCH,
    CheckpointRecord,
    MatEntry,
    compress_kg_map,
    expand_kg_map,
)
from dstl_client.coordinator.registry import SharedStateRegistry
from dstl_client.coordinator.storage import (
    CheckpointExists,
    CheckpointMissing,
    CheckpointStorage,
)
from dstl_client.core.atomic import is_temp_name
from dstl_client.core.errors import InvalidArgument
from tests.dstl_client.coordinator._helpers import handle, result

MAX_P = 8


def test_kg_map_compression_round_trips() -> None:
    per_kg: list[tuple[str | None, int]] = [(None, NO_BATCH)] * MAX_P
    per_kg[2] = ("p", 3)
    per_kg[3] = ("p", 3)
    per_kg[5] = (None, 4)
    entries = compress_kg_map(per_kg)
    assert entries == [MatEntry(2, 3, "p", 3), MatEntry(5, 5, None, 4)]
    assert expand_kg_map(entries, MAX_P) == per_kg
    with pytest.raises(InvalidArgument):
        expand_kg_map([MatEntry(0, MAX_P, "p", 1)], MAX_P)


def test_next_record_tracks_parts_segments_and_re_references() -> None:
    a, b = (0, 3), (4, 7)
    # batches 0 and 1: changelog only
    r0 = next_record(
        None,
        job_id="job",
        operator_id="op",
        batch_id=0,
        max_parallelism=MAX_P,
        parallelism=2,
        results=[result(0, a, 0, handle(a, "o1")), result(1, b, 0, handle(b, "o1"))],
    )
    r1 = next_record(
        r0,
        job_id="job",
        operator_id="op",
        batch_id=1,
        max_parallelism=MAX_P,
        parallelism=2,
        results=[result(0, a, 1, handle(a, "o2")), result(1, b, 1, None)],
    )
    assert [s.batch for s in r1.segments] == [0, 0, 1]
    assert r1.object_keys() == {"o1", "o2"}
    # batch 2: subtask 0 materializes version 1 (kgs 0,1 uploaded, 2 cleared, 3 unchanged)
    part = handle(a, "m1")
    mat = MatResult(1, part, uploaded=(0, 1), cleared=(2,))
    r2 = next_record(
        r1,
        job_id="job",
        operator_id="op",
        batch_id=2,
        max_parallelism=MAX_P,
        parallelism=2,
        results=[result(0, a, 2, handle(a, "o3"), mat), result(1, b, 2, handle(b, "o3"))],
    )
    per_kg = r2.mat_per_kg()
    assert per_kg[:4] == [(part.log_id, 1), (part.log_id, 1), (None, 1), (None, 1)]
    assert per_kg[4:] == [(None, NO_BATCH)] * 4
    # subtask 0's segments of batches 0-1 are covered; subtask 1's batch-0 one is not
    assert [(s.batch, s.first) for s in r2.segments] == [(0, 4), (2, 0), (2, 4)]
    assert r2.object_keys() == {"o1", "o3", "m1"}
    # batch 3: subtask 0 materializes again, only kg 3 changed: kgs 0,1 keep part m1
    part2 = handle(a, "m2")
    r3 = next_record(
        r2,
        job_id="job",
        operator_id="op",
        batch_id=3,
        max_parallelism=MAX_P,
        parallelism=2,
        results=[
            result(0, a, 3, None, MatResult(2, part2, uploaded=(3,), cleared=())),
            result(1, b, 3, None),
        ],
    )
    per_kg = r3.mat_per_kg()
    assert per_kg[:4] == [(part.log_id, 2), (part.log_id, 2), (None, 2), (part2.log_id, 2)]
    assert set(r3.parts) == {part.log_id, part2.log_id}
    assert [(s.batch, s.first) for s in r3.segments] == [(0, 4), (2, 4)]
    # JSON round trip
    again = CheckpointRecord.from_bytes(r3.to_bytes())
    assert again == r3
    assert TaskResult.from_bytes(
        result(0, a, 3, part, MatResult(2, part2, (3,), ())).to_bytes()
    ) == (result(0, a, 3, part, MatResult(2, part2, (3,), ())))
    late = replace(result(0, a, 3, None, MatResult(2, part2, (3,), ())), mat_batch=2)
    assert TaskResult.from_bytes(late.to_bytes()) == late
    # a materialization older than the recorded one never moves a key group back
    old = handle(a, "old")
    r4 = next_record(
        r3,
        job_id="job",
        operator_id="op",
        batch_id=4,
        max_parallelism=MAX_P,
        parallelism=2,
        results=[
            result(0, a, 4, None, MatResult(1, old, uploaded=(0, 1, 2, 3), cleared=())),
            result(1, b, 4, None),
        ],
    )
    assert r4.mat_per_kg() == r3.mat_per_kg()
    assert old.log_id not in r4.parts


def test_max_parallelism_is_fixed() -> None:
    r0 = next_record(
        None,
        job_id="j",
        operator_id="o",
        batch_id=0,
        max_parallelism=MAX_P,
        parallelism=1,
        results=[result(0, (0, 7), 0, None)],
    )
    with pytest.raises(InvalidArgument):
        next_record(
            r0,
            job_id="j",
            operator_id="o",
            batch_id=1,
            max_parallelism=16,
            parallelism=1,
            results=[result(0, (0, 15), 1, None)],
        )


def test_registry_follows_the_seed_example() -> None:
    """Seed 003, Figure 4: four incremental checkpoints, two retained."""
    reg = SharedStateRegistry()
    retained: list[int] = []
    deleted: list[str] = []

    def complete(cp: int, files: set[str]) -> None:
        reg.register(cp, files)
        retained.append(cp)
        while len(retained) > 2:
            deleted.extend(reg.unregister(retained.pop(0)))

    complete(1, {"s1", "s2"})
    complete(2, {"s1", "s2", "s3", "s4"})
    complete(3, {"s123", "s4", "s5"})
    assert deleted == []  # CP1 dropped, but CP2 still uses s1 and s2
    assert reg.count("s1") == 1 and reg.count("s4") == 2
    complete(4, {"s123", "s456"})
    assert sorted(deleted) == ["s1", "s2", "s3"]
    assert reg.referenced() == {"s123", "s4", "s5", "s456"}
    with pytest.raises(ValueError):
        reg.register(4, {"x"})


def _record(batch: int) -> CheckpointRecord:
    return next_record(
        None,
        job_id="j",
        operator_id="o",
        batch_id=batch,
        max_parallelism=MAX_P,
        parallelism=1,
        results=[result(0, (0, 7), batch, handle((0, 7), "obj"))],
    )


def test_records_are_written_once_and_atomically(tmp_path: Path) -> None:
    store = CheckpointStorage(tmp_path)
    store.write(_record(3))
    store.write(_record(12))
    assert store.batch_ids() == [3, 12]
    path = tmp_path / store.name_of(3)
    assert store.load(3) == _record(3).__class__.from_bytes(path.read_bytes())
    assert store.describe(3) == str(path)
    original = path.read_bytes()
    with pytest.raises(CheckpointExists, match="another driver"):
        store.write(_record(3))
    assert path.read_bytes() == original
    assert not [n for n in os.listdir(tmp_path) if is_temp_name(n) or n.startswith(".tmp-")]
    (tmp_path / ".tmp-crashed").write_bytes(b"half")
    (tmp_path / ".ck-000000000013.json.0123456789ab.tmp-dstl").write_bytes(b"half")
    assert store.batch_ids() == [3, 12]  # temp files are never records
    assert store.remove_temp_files() == 2
    store.delete(3)
    assert store.batch_ids() == [12]
    with pytest.raises(CheckpointMissing):
        store.load(3)
    store.delete(3)  # deleting a missing record is fine
