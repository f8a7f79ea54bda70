"""Restoring a chosen checkpoint, and disposing of a job's checkpoints.

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
3. Spark's progress past N is moved aside (a local or ``file://``
   ``checkpointLocation`` only): the entries of batches > N of ``offsets/``,
   ``commits/`` and each ``sources/<i>/`` metadata log (with their ``.crc``
   files) go to ``<parent>/superseded/<time>-to-<N>/<spark folder>/``, so Spark
   finds N as its last committed batch and plans N+1 from N's end offsets
   (a file source finds the files of the later batches unseen again). Its
   ``offsets/N`` must be the source progress recorded in record N (else the
   Spark checkpoint is not this job's: refused). A source log compacted at a
   batch > N cannot be cut back (refused; Spark compacts a file source's log
   every 10 batches).
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

**Dispose**: :func:`dispose_job` deletes every record (retained and
superseded) of every keyed operator of the job, the configuration overrides
and restore markers, optionally every object of the job (``DiscardObjects``
through the sidecar) and the local Spark checkpoint folders (so a new start
begins from nothing rather than from Spark's progress without its state).
:func:`dispose_operator` does the same for one operator, discarding only the
objects no other operator's record uses (``DstlQuery.stop(cancel=True)`` with
``retain_on_cancel=False``, Flink's DELETE_ON_CANCELLATION).

Thread: plain functions of the caller's thread, on a stopped job.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dstl_client.checkpoint.records import MAX_BATCH_ID
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
    url_scheme,
)
from dstl_client.coordinator.metadata import CorruptMetadata, MetadataStore
from dstl_client.coordinator.retention import (
    other_operators_records,
    records_object_keys,
    records_references,
)
from dstl_client.coordinator.storage import CheckpointMissing, CheckpointStorage
from dstl_client.core.errors import ConfigError

log = logging.getLogger(__name__)

#: Spark's logs whose entries are named by batch id
_SPARK_LOGS = ("offsets", "commits")
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


# ---------------------------------------------------------------- restore


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


def _spark_batch(name: str) -> tuple[int, bool] | None:
    """``(batch, compacted)`` of a Spark metadata log file name (``4``, ``.4.crc``, ``9.compact``)."""
    n = name
    if n.startswith(".") and n.endswith(".crc"):
        n = n[1:-4]
    compact = n.endswith(".compact")
    if compact:
        n = n[: -len(".compact")]
    return (int(n), compact) if n.isdigit() else None


def _local(location: str) -> Path | None:
    scheme = url_scheme(location)
    if scheme not in ("", "file"):
        return None
    return Path(urlsplit(location).path if scheme else location)


def _offsets_lines(path: Path) -> list[Any]:
    out: list[Any] = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out


@dataclass(frozen=True, slots=True)
class SparkRollback:
    """A checked roll back of a Spark checkpoint: the log entries to move aside."""

    root: Path
    todo: tuple[Path, ...]

    def apply(self, stamp: str) -> tuple[list[str], str | None]:
        """Move the entries to ``<parent>/superseded/<stamp>/<name>/``; (moved, where)."""
        if not self.todo:
            return [], None
        aside = self.root.parent / "superseded" / stamp / self.root.name
        moved: list[str] = []
        for f in self.todo:
            if not f.exists():  # moved by an earlier, interrupted attempt
                continue
            rel = f.relative_to(self.root)
            dest = aside / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
            moved.append(rel.as_posix())
        return moved, str(aside)


def roll_back_spark(
    spark_dir: str, batch_id: int, source_progress: Any, *, stamp: str
) -> tuple[list[str], str | None]:
    """Move Spark's log entries of batches > ``batch_id`` aside; (moved, where).

    :func:`plan_spark_rollback` (every check, nothing moved when one fails),
    then :meth:`SparkRollback.apply`.
    """
    return plan_spark_rollback(spark_dir, batch_id, source_progress).apply(stamp)


def plan_spark_rollback(spark_dir: str, batch_id: int, source_progress: Any) -> SparkRollback:
    """What rolling Spark's checkpoint back to ``batch_id`` moves; changes nothing.

    Nothing to move when there is no Spark checkpoint at ``spark_dir``.
    Raises :class:`ConfigError` when it is not local, when its ``offsets/``
    entry of the batch is missing or differs from ``source_progress`` (the
    record's), or when a source log was compacted past the batch.
    """
    root = _local(spark_dir)
    if root is None:
        raise ConfigError(
            f"the Spark checkpoint {spark_dir} is not on a local file system: roll it back "
            f"yourself (move the entries of batches > {batch_id} out of its offsets/, commits/ "
            "and sources/*/ folders) and restore with --no-spark"
        )
    if not root.is_dir():
        return SparkRollback(root, ())
    offsets = root / "offsets"
    if offsets.is_dir():
        mine = offsets / str(batch_id)
        if not mine.is_file():
            raise ConfigError(
                f"Spark's offsets log has no entry of batch {batch_id} ({mine}): Spark cannot "
                "resume from it"
            )
        if source_progress is not None and _offsets_lines(mine) != source_progress:
            raise ConfigError(
                f"Spark's offsets of batch {batch_id} ({mine}) differ from the source progress "
                "recorded in its checkpoint: is this the job's Spark checkpoint?"
            )
    logs = [root / d for d in _SPARK_LOGS]
    sources = root / "sources"
    if sources.is_dir():
        logs += sorted(p for p in sources.iterdir() if p.is_dir())
    todo: list[Path] = []
    for folder in logs:
        if not folder.is_dir():
            continue
        for f in sorted(folder.iterdir()):
            parsed = _spark_batch(f.name)
            if parsed is None or parsed[0] <= batch_id:
                continue
            if parsed[1]:
                raise ConfigError(
                    f"Spark compacted its source log at batch {parsed[0]} ({f}), after batch "
                    f"{batch_id}: the source cannot be rolled back that far"
                )
            todo.append(f)
    return SparkRollback(root, tuple(todo))


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
    root = _local(location)
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
