"""Retention and discards without a sidecar: objects shared by the job's keyed operators."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

from dstl_client.checkpoint.next_record import next_record
from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.retention import RetainedCheckpoints
from dstl_client.coordinator.storage import CheckpointStorage
from dstl_client.core.errors import SidecarUnavailable
from tests.dstl_client.coordinator._helpers import handle, result

MAX_P = 8


class FakeClient:
    """Records DiscardObjects calls; fails them while ``down``."""

    def __init__(self) -> None:
        self.discarded: list[str] = []
        self.down = False

    def discard_objects(self, job_id: str, object_keys: Sequence[str]) -> int:
        if self.down:
            raise SidecarUnavailable("injected")
        self.discarded.extend(object_keys)
        return len(object_keys)


def config(root: Path, operator_id: str, retain: int = 1) -> CoordinatorConfig:
    return CoordinatorConfig(
        job_id="job",
        checkpoint_dir=str(root),
        operator_id=operator_id,
        max_parallelism=MAX_P,
        retain=retain,
        fsync=False,
    )


def record(cfg: CoordinatorConfig, batch: int, *objects: str) -> CheckpointRecord:
    rng = (0, MAX_P - 1)
    return next_record(
        None,
        job_id=cfg.job_id,
        operator_id=cfg.operator_id,
        batch_id=batch,
        max_parallelism=MAX_P,
        parallelism=1,
        results=[result(0, rng, batch, handle(rng, *objects))],
    )


def retention(cfg: CoordinatorConfig, client: FakeClient) -> RetainedCheckpoints:
    storage = CheckpointStorage(cfg.open_metadata(), cfg.records_prefix)
    return RetainedCheckpoints(cfg, storage, lambda: cast(ChangelogClient, client))


def test_an_object_another_operator_uses_is_not_discarded(tmp_path: Path) -> None:
    mine, other = config(tmp_path, "keyed"), config(tmp_path, "other")
    client = FakeClient()
    ours = retention(mine, client)
    ours.load()
    ours.storage.write(record(mine, 9, "x"))  # listed by the other operator once it has records
    assert other.other_records_prefixes(ours.storage.store) == [mine.records_prefix]
    ours.storage.delete(9)
    # object "shared" holds sections of both operators' writers (one flush of the job)
    ours.storage.write(r0 := record(mine, 0, "shared", "a0"))
    ours.add(r0)
    CheckpointStorage(ours.storage.store, other.records_prefix).write(
        record(other, 0, "shared", "b0")
    )
    r1 = record(mine, 1, "a1")
    ours.storage.write(r1)
    assert ours.add(r1) == 1  # batch 0 dropped: "a0" goes, "shared" stays
    assert client.discarded == ["a0"]
    assert ours.storage.batch_ids() == [1]
    assert ours.job_referenced() == {"a1", "shared", "b0"}
    # once the other operator dropped it, the object goes with its last user
    theirs = retention(other, client)
    theirs.load()
    r2 = record(other, 1, "b1")
    theirs.storage.write(r2)
    assert theirs.add(r2) == 2
    assert sorted(client.discarded) == ["a0", "b0", "shared"]


def test_failed_discards_are_retried_with_the_next_record(tmp_path: Path) -> None:
    cfg = config(tmp_path, "keyed")
    client = FakeClient()
    ret = retention(cfg, client)
    ret.load()
    for batch, obj in enumerate(["o0", "o1", "o2"]):
        client.down = batch == 1
        rec = record(cfg, batch, obj)
        ret.storage.write(rec)
        ret.add(rec)
    assert client.discarded == ["o0", "o1"]  # o0 failed at batch 1, went at batch 2


def test_an_unreadable_record_of_another_operator_postpones_discards(tmp_path: Path) -> None:
    mine, other = config(tmp_path, "keyed"), config(tmp_path, "other")
    client = FakeClient()
    ret = retention(mine, client)
    ret.load()
    bad = CheckpointStorage(ret.storage.store, other.records_prefix).name_of(0)
    ret.storage.store.put(bad, b"{not json")
    for batch in range(2):
        rec = record(mine, batch, f"o{batch}")
        ret.storage.write(rec)
        ret.add(rec)
    assert client.discarded == []
    ret.storage.store.delete(bad)
    rec = record(mine, 2, "o2")
    ret.storage.write(rec)
    ret.add(rec)
    assert client.discarded == ["o0", "o1"]
