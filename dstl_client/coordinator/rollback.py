"""Restoring a chosen checkpoint: the operator rolled back to a retained batch N.

**Restore (roll back) to batch N**, on a stopped job (``dstl checkpoints
restore N``, or ``restore_from=N`` at the start of a query, like Flink's
``-s``): the job then resumes as if it had stopped right after batch N.

1. Everything is checked before anything changes: N must be a retained
   record of the operator (else :class:`~.storage.CheckpointMissing` listing
   the retained batches), and Spark's checkpoint must be one that can be
   rolled back to N (below; else :class:`~dstl_client.core.errors.ConfigError`).
   A refused restore writes nothing, so the next plain start resumes from the
   latest record as if it had never been asked.
2. The marker ``restore.json`` of the operator says "restore to N begun"
   (replaced atomically; it names the Spark checkpoint chosen, ``None`` for
   ``--no-spark``): from here on the restore is accepted and is finished,
   by this call or by the next start.
3. Spark's progress past N is moved aside (:mod:`.spark_rollback`; a local
   or ``file://`` ``checkpointLocation`` only).
4. Records of batches > N are **moved aside, never deleted**: copied
   write-once to ``<records prefix>superseded/ck-<batch>.json``, then removed
   from the records. Records are write-once, so this is what lets the new run
   write its own record of batch N+1. A superseded record stays (its objects
   are kept: every discard and orphan sweep counts it as a reference) until
   the new run records a checkpoint of its batch or a later one
   (:meth:`~.retention.RetainedCheckpoints.add` then deletes it and discards
   what only it used).
5. The marker says "done" (replaced atomically, last).

Every step is idempotent: a restore interrupted anywhere is finished by
running it again, and a coordinator starting while a marker says "begun"
finishes it before anything else (with the Spark checkpoint the marker
names, not its own default). ``restore_from=N`` acts once per N: a
driver restarted with the same option finds the marker done for N and
resumes from its latest record (run ``dstl checkpoints restore N`` to roll
back to the same batch a second time).

Thread: plain functions of the caller's thread, on a stopped job.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from dstl_client.checkpoint.records import MAX_BATCH_ID
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.metadata import CorruptMetadata, MetadataStore
from dstl_client.coordinator.spark_rollback import plan_spark_rollback
from dstl_client.coordinator.storage import CheckpointMissing, CheckpointStorage
from dstl_client.core.errors import ConfigError

__all__ = ["RestoreResult", "read_marker", "restore_checkpoint", "restore_on_start"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What a restore did."""

    batch_id: int
    #: batch ids of the records moved aside (``superseded/``)
    superseded: tuple[int, ...]
    #: Spark log entries moved aside, relative to the Spark checkpoint
    spark_moved: tuple[str, ...]
    #: where they went (``None``: nothing moved, or no Spark checkpoint)
    spark_aside: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "superseded": list(self.superseded),
            "spark_moved": list(self.spark_moved),
            "spark_aside": self.spark_aside,
        }


def read_marker(store: MetadataStore, config: CoordinatorConfig) -> dict[str, Any] | None:
    """The operator's last restore (``{"batch_id", "done", ...}``), if any.

    A marker that does not decode raises :class:`~.metadata.CorruptMetadata`
    naming it (never ignored: a begun restore must not be forgotten).
    """
    name = config.restore_marker_name
    data = store.get(name)
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CorruptMetadata(f"{store.describe(name)}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CorruptMetadata(f"{store.describe(name)}: not a JSON object")
    batch = doc.get("batch_id")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch <= MAX_BATCH_ID:
        raise CorruptMetadata(
            f"{store.describe(name)}: batch_id {batch!r} is not a batch id (0 to {MAX_BATCH_ID})"
        )
    if not isinstance(doc.get("done"), bool):
        raise CorruptMetadata(f"{store.describe(name)}: done {doc.get('done')!r} is not a boolean")
    spark = doc.get("spark_dir")
    if spark is not None and not isinstance(spark, str):
        raise CorruptMetadata(f"{store.describe(name)}: spark_dir {spark!r} is not a string")
    return doc


def _write_marker(store: MetadataStore, config: CoordinatorConfig, doc: dict[str, Any]) -> None:
    store.put(config.restore_marker_name, json.dumps(doc, sort_keys=True).encode())


def restore_on_start(
    config: CoordinatorConfig, store: MetadataStore, spark_dir: str | None
) -> RestoreResult | None:
    """What a starting coordinator does: finish a begun restore, or apply ``restore_from`` once."""
    marker = read_marker(store, config)
    if marker is not None and not marker.get("done"):
        log.warning(
            "finishing the interrupted restore of job %s operator %s to batch %d",
            config.job_id,
            config.operator_id,
            marker["batch_id"],
        )
        # the Spark checkpoint the restore was begun with (older markers name none: ours)
        spark = marker.get("spark_dir", spark_dir)
        return restore_checkpoint(config, store, int(marker["batch_id"]), spark_dir=spark)
    want = config.restore_from
    if want is None:
        return None
    if marker is not None and marker["batch_id"] == want:
        log.info(
            "restore_from=%d: already restored (%s); resuming from the latest record",
            want,
            store.describe(config.restore_marker_name),
        )
        return None
    return restore_checkpoint(config, store, want, spark_dir=spark_dir, check_parallelism=True)


def restore_checkpoint(
    config: CoordinatorConfig,
    store: MetadataStore,
    batch_id: int,
    *,
    spark_dir: str | None,
    now: float | None = None,
    check_parallelism: bool = False,
) -> RestoreResult:
    """Roll the operator back to its retained checkpoint ``batch_id`` (see the module docs).

    ``spark_dir``: the operator's Spark ``checkpointLocation`` (``None``: leave
    Spark's progress alone, e.g. a job run without Spark). Raises
    :class:`CheckpointMissing` (not retained), :class:`ConfigError` (a Spark
    checkpoint that cannot be rolled back; a record of another job or
    operator; with ``check_parallelism``, as a starting driver restores, a
    record taken with another ``max_parallelism`` than the config's), each
    before anything is written.
    """
    records = CheckpointStorage(store, config.records_prefix)
    aside = CheckpointStorage(store, config.superseded_prefix)
    retained = records.batch_ids()
    if batch_id not in retained:
        superseded = aside.batch_ids()
        raise CheckpointMissing(
            f"batch {batch_id} is not a retained checkpoint of job {config.job_id!r} operator "
            f"{config.operator_id!r} at {store.url}: the retained ones are "
            f"{', '.join(map(str, retained)) or 'none'}"
            + (
                f" (superseded by a restore: {', '.join(map(str, superseded))})"
                if superseded
                else ""
            )
        )
    record = records.load(batch_id)
    where = records.describe(batch_id)
    if record.job_id != config.job_id or record.operator_id != config.operator_id:
        raise ConfigError(
            f"{where} belongs to job {record.job_id!r} operator {record.operator_id!r}, not "
            f"{config.job_id!r} {config.operator_id!r}: nothing restored"
        )
    if check_parallelism and record.max_parallelism != config.max_parallelism:
        raise ConfigError(
            f"max_parallelism={config.max_parallelism} but {where} was taken with "
            f"{record.max_parallelism} (it is fixed when a job is created): nothing restored"
        )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    # every check before the first write: a refused restore leaves no trace
    spark_plan = (
        plan_spark_rollback(spark_dir, batch_id, record.source_progress)
        if spark_dir is not None
        else None
    )
    _write_marker(
        store,
        config,
        {
            "batch_id": batch_id,
            "done": False,
            "spark_dir": spark_dir,
            "started_unix": time.time() if now is None else now,
        },
    )
    moved: list[str] = []
    aside_dir: str | None = None
    if spark_plan is not None:
        moved, aside_dir = spark_plan.apply(f"{stamp}-to-{batch_id}")
    newer = [b for b in retained if b > batch_id]
    for b in newer:
        data = store.get(records.name_of(b))
        if data is None:
            continue
        name = aside.name_of(b)
        if not store.put_once(name, data) and store.get(name) != data:
            # a superseded record of an earlier restore that the new run has not
            # recorded past yet: it is stale (the live record of b is newer)
            store.put(name, data)
        records.delete(b)
    _write_marker(
        store,
        config,
        {
            "batch_id": batch_id,
            "done": True,
            "superseded": newer,
            "spark_aside": aside_dir,
            "unix": time.time() if now is None else now,
        },
    )
    log.info(
        "job %s operator %s restored to batch %d: records %s moved aside, %d Spark log entries",
        config.job_id,
        config.operator_id,
        batch_id,
        newer,
        len(moved),
    )
    return RestoreResult(batch_id, tuple(newer), tuple(moved), aside_dir)
