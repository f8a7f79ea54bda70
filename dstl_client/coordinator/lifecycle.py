"""A job's keyed operators in its metadata store, what their records use, and disposing of them.

**Dispose**: :func:`dispose_job` deletes every record (retained and
superseded) of every keyed operator of the job, the configuration overrides
and restore markers, optionally every object of the job (``DiscardObjects``
through the sidecar) and the local Spark checkpoint folders (so a new start
begins from nothing rather than from Spark's progress without its state).
:func:`dispose_operator` does the same for one operator, discarding only the
objects no other operator's record uses (``DstlQuery.stop(cancel=True)`` with
``retain_on_cancel=False``, Flink's DELETE_ON_CANCELLATION).

Restoring a chosen checkpoint (a roll back) is :mod:`.rollback`. The layout
functions here (:func:`job_operators`, :func:`job_references`) serve the CLI
and the orphan sweep too.

Thread: plain functions of the caller's thread, on a stopped job.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from typing import Any

from dstl_client.client import ChangelogClient
from dstl_client.coordinator.cleanup import JobReferences
from dstl_client.coordinator.config import (
    DEFAULT_OPERATOR,
    OPERATORS,
    OVERRIDES,
    RECORDS,
    RESTORE_MARKER,
    SUPERSEDED,
    CoordinatorConfig,
)
from dstl_client.coordinator.metadata import MetadataStore
from dstl_client.coordinator.retention import (
    other_operators_records,
    records_object_keys,
    records_references,
)
from dstl_client.coordinator.spark_rollback import local_path
from dstl_client.coordinator.storage import CheckpointStorage

log = logging.getLogger(__name__)

#: keys per DiscardObjects call
_DISCARD_CHUNK = 5_000


# ------------------------------------------------------------------ layout


def job_operators(store: MetadataStore) -> dict[str, str]:
    """``{operator id: records prefix}`` of every keyed operator with files in ``store``."""
    out: dict[str, str] = {}
    if store.list(RECORDS):
        out[DEFAULT_OPERATOR] = RECORDS
    for name in store.list(OPERATORS):
        parts = name.split("/")
        if len(parts) >= 4 and parts[2] == RECORDS.rstrip("/"):
            out.setdefault(parts[1], f"{OPERATORS}{parts[1]}/{RECORDS}")
    return dict(sorted(out.items()))


def operator_prefix(operator_id: str) -> str:
    return "" if operator_id == DEFAULT_OPERATOR else f"{OPERATORS}{operator_id}/"


def job_references(store: MetadataStore, job_id: str) -> JobReferences:
    """Every object any record (retained or superseded) of any operator in ``store`` uses.

    With the number of records of ``job_id`` read, the evidence an orphan
    sweep needs (:meth:`~.cleanup.JobReferences.check`); records of other
    jobs there count for nothing (their keys are kept all the same). Raises
    :class:`~.retention.UnreadableRecords` when a record cannot be read.
    """
    keys: set[str] = set()
    jobs: dict[str, int] = {}
    for prefix in job_operators(store).values():
        for p in (prefix, prefix + SUPERSEDED):
            found, by_job = records_references(CheckpointStorage(store, p))
            keys |= found
            for job, n in by_job.items():
                jobs[job] = jobs.get(job, 0) + n
    return JobReferences(
        job_id=job_id,
        keys=frozenset(keys),
        records=jobs.pop(job_id, 0),
        where=store.url,
        other_jobs=tuple(sorted(jobs)),
    )


# ---------------------------------------------------------------- dispose


@dataclass(frozen=True, slots=True)
class DisposeResult:
    """What a dispose removed."""

    records: int
    objects: int
    spark_dirs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "objects": self.objects,
            "spark_dirs": list(self.spark_dirs),
        }


def _delete_operator_files(store: MetadataStore, prefix: str, records_prefix: str) -> int:
    n = 0
    for name in store.list(records_prefix):
        store.delete(name)
        n += 1
    for name in (prefix + OVERRIDES, prefix + RESTORE_MARKER):
        store.delete(name)
    return n


def _remove_spark_dir(location: str) -> str | None:
    root = local_path(location)
    if root is None:
        log.warning("Spark checkpoint %s is not local: not removed", location)
        return None
    if not root.is_dir():
        return None
    shutil.rmtree(root)
    return str(root)


def _discard(client: ChangelogClient, job_id: str, keys: set[str]) -> int:
    ordered = sorted(keys)
    deleted = 0
    for i in range(0, len(ordered), _DISCARD_CHUNK):
        deleted += client.discard_objects(job_id, ordered[i : i + _DISCARD_CHUNK])
    return deleted


def dispose_job(
    store: MetadataStore,
    *,
    job_id: str,
    client: ChangelogClient | None = None,
    spark_dirs: tuple[str, ...] = (),
) -> DisposeResult:
    """Delete every record, override and marker of the job; with ``client`` every object too.

    ``spark_dirs``: Spark checkpoint folders to remove (local ones only).
    """
    records = 0
    for op, prefix in job_operators(store).items():
        records += _delete_operator_files(store, operator_prefix(op), prefix)
    store.delete(OVERRIDES)
    store.delete(RESTORE_MARKER)
    objects = 0
    if client is not None:
        batch: list[str] = []
        for obj in client.list_objects(job_id):
            batch.append(obj.key)
            if len(batch) >= _DISCARD_CHUNK:
                objects += client.discard_objects(job_id, batch)
                batch = []
        if batch:
            objects += client.discard_objects(job_id, batch)
    removed = tuple(d for d in (_remove_spark_dir(s) for s in spark_dirs) if d)
    return DisposeResult(records, objects, removed)


def dispose_operator(
    config: CoordinatorConfig,
    store: MetadataStore,
    *,
    client: ChangelogClient | None,
    remove_spark: bool = True,
) -> DisposeResult:
    """Delete one operator's records (retained and superseded), overrides and marker.

    With ``client``, the objects those records used that no record of another
    operator of the job uses are discarded; with ``remove_spark``, the
    operator's local Spark checkpoint is removed.
    """
    mine = records_object_keys(CheckpointStorage(store, config.records_prefix))
    mine |= records_object_keys(CheckpointStorage(store, config.superseded_prefix))
    others: set[str] = set()
    for storage in other_operators_records(config, store):
        others |= records_object_keys(storage)
    records = _delete_operator_files(store, config.operator_prefix, config.records_prefix)
    objects = _discard(client, config.job_id, mine - others) if client is not None else 0
    spark = _remove_spark_dir(config.spark_checkpoint_dir) if remove_spark else None
    return DisposeResult(records, objects, (spark,) if spark else ())
