"""Restore: rebuild a key-group range's local store as of a committed checkpoint.

Key groups are the unit: each key group's rows come from its materialized
part, then the changelog segments recorded after that materialization are
replayed in batch (and SQN) order, filtered to the store's key groups. So
any parallelism restores from any record (rescaling), and the same code
reads a whole checkpoint for tools (:func:`restore_range` over every key
group).

Runs on the task's thread; the store is the task's (locked), the client is
thread-safe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dstl_client.client import ChangelogClient
from dstl_client.coordinator.records import CheckpointRecord
from dstl_client.core.errors import CorruptObject
from dstl_client.core.format import split_changes
from dstl_client.state.backend import KeyedStateBackend
from dstl_client.state.changes import OP_PUT, decode_change
from dstl_client.state.clients import close_log
from dstl_client.state.store import LocalKeyedStore
from dstl_client.state.store_dirs import remove_overlapping_stores

log = logging.getLogger(__name__)

#: rows written to the store per call while loading a part
_WRITE_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class RestoreCounts:
    """What a restore read: rows of materialized parts, replayed changes, bytes."""

    rows: int = 0
    replayed: int = 0
    bytes: int = 0


def restore_range(
    store: LocalKeyedStore,
    committed: CheckpointRecord,
    client: ChangelogClient,
    attempt: str = "",
) -> RestoreCounts:
    """Reset ``store`` and rebuild its key groups as of the ``committed`` checkpoint.

    Loads each key group's rows from its materialized part, then replays, in
    batch order, the changelog segments after that materialization, filtered
    to the store's key groups. The store ends at version
    ``(committed.batch_id, attempt or "restored")``.
    """
    store.reset()
    rng = store.kg_range
    per_kg = committed.mat_per_kg()
    changed: dict[int, int] = {}
    rows = 0
    read_bytes = 0
    for pid, handle in committed.parts.items():
        kgs = [kg for kg in rng if per_kg[kg][0] == pid]
        if not kgs:
            continue
        batch: list[tuple[int, bytes, bytes | None]] = []
        for view in client.read_changesets(handle, kgs):
            kg = view.key_group
            read_bytes += len(view.payload)
            for data in split_changes(view.count, view.sizes, view.payload):
                op, k, v = decode_change(data)
                if op != OP_PUT:
                    raise CorruptObject(f"materialized part {pid} holds a change of type {op}")
                batch.append((kg, k, v))
            rows += view.count
            if len(batch) >= _WRITE_BATCH:
                store.write_main(batch)
                batch = []
        store.write_main(batch)
        for kg in kgs:
            changed[kg] = per_kg[kg][1]
    backend = KeyedStateBackend(store, committed.max_parallelism, target="main")
    replayed = 0
    for seg in sorted(committed.segments, key=lambda s: (s.batch, s.first)):
        inter = seg.kg_range.intersection(rng)
        if inter is None:
            continue
        kgs = [kg for kg in inter if per_kg[kg][1] < seg.batch]
        if not kgs:
            continue
        for kg, _sqn, data in client.read_changes(seg.handle, kgs):
            backend.apply_change(kg, data)
            changed[kg] = seg.batch
            replayed += 1
            read_bytes += len(data)
    backend.flush()
    store.begin()
    store.mark_changed(changed)
    store.set_meta(main_version=committed.batch_id, main_attempt=attempt or "restored")
    store.commit()
    return RestoreCounts(rows=rows, replayed=replayed, bytes=read_bytes)


def restore_subtask(
    store: LocalKeyedStore,
    committed: CheckpointRecord,
    client: ChangelogClient,
    *,
    job_id: str,
    attempt: str,
) -> RestoreCounts:
    """A subtask's restore: :func:`restore_range`, then stale stores of its key groups go.

    Stores of other ranges overlapping this one (left by another parallelism)
    are deleted, and their changelog writers closed at the sidecar.
    """
    counts = restore_range(store, committed, client, attempt)
    for _path, log_id in remove_overlapping_stores(
        store.directory.parent, store.kg_range, store.directory
    ):
        if log_id:  # that range's changelog writer is no longer needed
            close_log(client, job_id, log_id)
    log.info("%s restored to batch %d: %s", store.kg_range, committed.batch_id, counts)
    return counts
