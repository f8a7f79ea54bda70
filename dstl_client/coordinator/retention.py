"""Retention: the retained checkpoints of one operator, their references, discards, orphans.

The newest ``retain`` records are kept; the :class:`SharedStateRegistry`
counts the objects they refer to. A record beyond the retained number is
deleted and the objects no retained record refers to any more are discarded
through the sidecar (``DiscardObjects``).

One sidecar object holds the sections of many writers of the job, so the
keyed operators of one job share objects: an object is discarded only when
no record of *any* keyed operator of the job in the job's metadata store
(listed there, see :class:`~dstl_client.coordinator.config.CoordinatorConfig`
for the layout) refers to it, and the orphan sweep is told every operator's
references.

Records a restore moved aside (``superseded/``, see :mod:`.lifecycle`) count
as references too, of this operator and of the others, until the new run
records a checkpoint of their batch or a later one: then :meth:`add` deletes
them and discards what only they used.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.cleanup import JobReferences, NoRecordsRead
from dstl_client.coordinator.config import SUPERSEDED, CoordinatorConfig
from dstl_client.coordinator.metadata import CorruptMetadata, MetadataStore
from dstl_client.coordinator.registry import SharedStateRegistry
from dstl_client.coordinator.storage import CheckpointMissing, CheckpointStorage
from dstl_client.core.errors import ConfigError, DstlError

log = logging.getLogger(__name__)

#: keys per DiscardObjects call (the sidecar accepts up to 10,000)
_DISCARD_CHUNK = 5_000


class Sweeper(Protocol):
    """What removes orphans (see :class:`~dstl_client.coordinator.cleanup.OrphanSweeper`)."""

    def sweep(self, references: JobReferences, *, now: float | None = None) -> int: ...


SweeperFactory = Callable[[ChangelogClient, str, float], Sweeper]
"""``factory(client, job_id, grace_s)`` -> the sweeper of one start."""


class UnreadableRecords(DstlError):
    """A record of another keyed operator of the job could not be read."""

    kind = "unreadable_records"


def records_object_keys(records: CheckpointStorage) -> set[str]:
    """Every object the ``records`` refer to (:class:`UnreadableRecords`)."""
    return records_references(records)[0]


def records_references(
    records: CheckpointStorage,
) -> tuple[set[str], dict[str, int]]:
    """Every object the ``records`` refer to, and how many records each job has there.

    A record that cannot be read raises :class:`UnreadableRecords`, one that
    does not decode :class:`~.metadata.CorruptMetadata` (never skipped: what
    it references would count as unreferenced); one deleted
    between the listing and the read (by its running driver) is skipped.
    """
    keys: set[str] = set()
    jobs: dict[str, int] = {}
    try:
        batch_ids = records.batch_ids()
    except DstlError as exc:
        raise UnreadableRecords(f"{records.store.describe(records.prefix)}: {exc}") from None
    for b in batch_ids:
        try:
            record = records.load(b)
        except CheckpointMissing:  # dropped meanwhile by its operator
            continue
        except CorruptMetadata:  # names the record already
            raise
        except (DstlError, OSError, ValueError) as exc:
            raise UnreadableRecords(f"{records.describe(b)}: {exc}") from None
        keys |= record.object_keys()
        jobs[record.job_id] = jobs.get(record.job_id, 0) + 1
    return keys, jobs


def other_operators_records(
    config: CoordinatorConfig, store: MetadataStore
) -> list[CheckpointStorage]:
    """The records of the job's other keyed operators in ``store`` (:class:`UnreadableRecords`)."""
    try:
        prefixes = config.other_records_prefixes(store)
    except DstlError as exc:
        raise UnreadableRecords(f"{store.url}: {exc}") from None
    # each operator's retained records, and those a restore moved aside (kept until superseded)
    return [
        CheckpointStorage(store, p) for prefix in prefixes for p in (prefix, prefix + SUPERSEDED)
    ]


class RetainedCheckpoints:
    """The retained records of one operator and the objects they keep alive.

    Invariants: ``registry`` counts exactly the records in :attr:`records`
    (oldest first, at most ``retain`` after :meth:`add`); a record is
    deleted before its objects are discarded; an object is discarded only
    while no retained record of this operator and no record in the store of
    another keyed operator of the job refers to it; a failed discard is
    retried at the next one.

    Thread: not thread-safe; the coordinator calls it under its lock.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        storage: CheckpointStorage,
        client: Callable[[], ChangelogClient],
    ) -> None:
        self.config = config
        self.storage = storage
        self._client = client
        self.registry = SharedStateRegistry()
        self._records: deque[CheckpointRecord] = deque()
        self._undiscarded: set[str] = set()
        #: records a restore moved aside, not yet superseded: batch id -> object keys
        self.superseded_storage = CheckpointStorage(storage.store, config.superseded_prefix)
        self._superseded: dict[int, set[str]] = {}

    @property
    def records(self) -> list[CheckpointRecord]:
        return list(self._records)

    @property
    def latest(self) -> CheckpointRecord | None:
        return self._records[-1] if self._records else None

    # ------------------------------------------------------------------ start
    def load(self) -> set[str]:
        """Load and register the retained records, delete older ones; their objects' keys.

        Raises :class:`ConfigError` when a record belongs to another job or
        operator or was taken with another ``max_parallelism``.
        """
        cfg = self.config
        self.storage.remove_temp_files()
        ids = self.storage.batch_ids()
        keep_ids = ids[-cfg.retain :]
        drop_ids = ids[: -cfg.retain] if len(ids) > cfg.retain else []
        for rec in (self.storage.load(b) for b in keep_ids):
            if rec.job_id != cfg.job_id or rec.operator_id != cfg.operator_id:
                raise ConfigError(
                    f"{self.storage.describe(rec.batch_id)} belongs to job {rec.job_id!r} "
                    f"operator {rec.operator_id!r}, not {cfg.job_id!r} {cfg.operator_id!r}"
                )
            if rec.max_parallelism != cfg.max_parallelism:
                raise ConfigError(
                    f"max_parallelism={cfg.max_parallelism} but the checkpoints were taken "
                    f"with {rec.max_parallelism}: it is fixed when a job is created"
                )
            self.registry.register(rec.batch_id, rec.object_keys())
            self._records.append(rec)
        dropped: set[str] = set()
        for b in drop_ids:
            try:
                dropped |= self.storage.load(b).object_keys()
            except (DstlError, OSError, ValueError) as exc:
                log.warning("unreadable old checkpoint record %d: %s", b, exc)
            self.storage.delete(b)
        latest = self._records[-1].batch_id if self._records else None
        dropped |= self._load_superseded(latest)
        return dropped

    def _load_superseded(self, latest: int | None) -> set[str]:
        """Load the records a restore moved aside; delete those ``latest`` supersedes, their keys."""
        self._superseded = {}
        for b in self.superseded_storage.batch_ids():
            try:
                keys = self.superseded_storage.load(b).object_keys()
            except CheckpointMissing:
                continue
            self._superseded[b] = keys
        return self._prune_superseded(latest) if latest is not None else set()

    def _prune_superseded(self, through: int) -> set[str]:
        """Delete the superseded records of batches <= ``through``; the keys they used."""
        keys: set[str] = set()
        for b in sorted(b for b in self._superseded if b <= through):
            self.superseded_storage.delete(b)
            keys |= self._superseded.pop(b)
            log.info(
                "superseded checkpoint record %d of job %s deleted: the new run recorded batch %d",
                b,
                self.config.job_id,
                through,
            )
        return keys

    @property
    def superseded(self) -> list[int]:
        """Batch ids of the records a restore moved aside that are still kept."""
        return sorted(self._superseded)

    def _superseded_keys(self) -> set[str]:
        out: set[str] = set()
        for keys in self._superseded.values():
            out |= keys
        return out

    def remove_orphans(self, dropped: set[str], sweeper: Sweeper | None) -> int:
        """Discard the objects of records dropped at start, then sweep the job's orphans.

        Best effort: a failing sweep is logged (the next start sweeps again).
        No sweep without a record of this job in the store (a new job, or a
        wrong ``metadata_url``: see :class:`~.cleanup.NoRecordsRead`).
        """
        try:
            refs = self.job_references()
        except (UnreadableRecords, CorruptMetadata) as exc:
            log.warning("no orphan cleanup of job %s: %s", self.config.job_id, exc)
            return 0
        referenced = refs.keys
        removed = self.discard(dropped - referenced) if dropped - referenced else 0
        if sweeper is not None:
            try:
                removed += sweeper.sweep(refs)
            except NoRecordsRead as exc:
                log.info("no orphan sweep of job %s: %s", self.config.job_id, exc)
            except DstlError as exc:
                log.warning("orphan sweep of job %s failed: %s", self.config.job_id, exc)
        return removed

    # ---------------------------------------------------------------- records
    def add(self, record: CheckpointRecord) -> int:
        """Retain a new record, drop those beyond ``retain``; the number of objects discarded."""
        self.registry.register(record.batch_id, record.object_keys())
        self._records.append(record)
        unused: set[str] = set(self._undiscarded)
        while len(self._records) > self.config.retain:
            old = self._records.popleft()
            self.storage.delete(old.batch_id)
            unused.update(self.registry.unregister(old.batch_id))
        if self._superseded:
            unused |= self._prune_superseded(record.batch_id)
        kept = self._superseded_keys()
        unused = {k for k in unused if not self.registry.is_referenced(k) and k not in kept}
        return self.discard(unused) if unused else 0

    def job_referenced(self) -> set[str]:
        """Objects any retained record of this operator or any record of another operator uses."""
        return set(self.job_references().keys)

    def job_references(self) -> JobReferences:
        """:meth:`job_referenced`, with how many records of this job they came from.

        This operator's retained records count (:meth:`load` checked their
        job); another operator's records count only when they are of this job
        (:class:`UnreadableRecords` when one cannot be read).
        """
        cfg = self.config
        keys = set(self.registry.referenced()) | self._superseded_keys()
        jobs: dict[str, int] = {}
        for records in other_operators_records(cfg, self.storage.store):
            found, by_job = records_references(records)
            keys |= found
            for job, n in by_job.items():
                jobs[job] = jobs.get(job, 0) + n
        return JobReferences(
            job_id=cfg.job_id,
            keys=frozenset(keys),
            records=len(self._records) + jobs.pop(cfg.job_id, 0),
            where=self.storage.store.url,
            other_jobs=tuple(sorted(jobs)),
        )

    def discard(self, keys: Iterable[str]) -> int:
        """Delete objects through the sidecar; failures are retried at the next chance."""
        todo = set(keys)
        if not todo:
            return 0
        try:
            others = other_operators_records(self.config, self.storage.store)
        except (UnreadableRecords, CorruptMetadata) as exc:
            log.warning("discards postponed: %s", exc)
            self._undiscarded.update(todo)
            return 0
        if others:
            shared: set[str] = set()
            try:
                for records in others:
                    shared |= records_object_keys(records)
            except (UnreadableRecords, CorruptMetadata) as exc:
                log.warning("discards postponed: %s", exc)
                self._undiscarded.update(todo)
                return 0
            # what another operator still uses is its to discard once it drops it
            self._undiscarded.difference_update(todo & shared)
            todo -= shared
        deleted = 0
        ordered = sorted(todo)
        for i in range(0, len(ordered), _DISCARD_CHUNK):
            chunk = ordered[i : i + _DISCARD_CHUNK]
            try:
                deleted += self._client().discard_objects(self.config.job_id, chunk)
                self._undiscarded.difference_update(chunk)
            except DstlError as exc:
                log.warning("discarding %d objects failed (retried later): %s", len(chunk), exc)
                self._undiscarded.update(chunk)
        return deleted
