"""Orphan cleanup through the sidecar: the driver never opens the blob store.

Objects a crash left behind (uploaded, then no checkpoint record came to
refer to them) are found by listing the job's objects with the sidecar's
``ListObjects`` and removed with ``DiscardObjects``; the driver needs only
its sidecar address and job token, no storage credentials.

"Unreferenced" is only known from records that were read: a sweep takes
:class:`JobReferences` (the keys *and* how many records of the job they came
from) and refuses with :class:`NoRecordsRead` when that is none. A wrong
metadata location (the checkpoint directory instead of its ``dstl/`` folder,
a path that does not exist, another job's metadata) holds no record of the
job, and "nothing found" must never become "nothing referenced".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dstl_client.client import ChangelogClient
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.core.keys import check_job_id
from dstl_client.objects import ObjectInfo

log = logging.getLogger(__name__)

#: objects younger than this are never swept (default ``grace_s``)
DEFAULT_GRACE_S = 600.0
#: keys per DiscardObjects call (the sidecar accepts up to 10,000)
DISCARD_BATCH = 10_000


class NoRecordsRead(ConfigError):
    """A sweep was asked for without one checkpoint record of the job read: refused.

    Its message says where the records were looked for. The CLI exits 2.
    """

    kind = "no_records_read"


@dataclass(frozen=True, slots=True)
class JobReferences:
    """What a job's checkpoint records reference, with the evidence that they were read.

    Built by whoever read the records (``dstl gc``:
    :func:`~dstl_client.coordinator.lifecycle.job_references`; the driver:
    :meth:`~dstl_client.coordinator.retention.RetainedCheckpoints.job_references`).
    Invariant: ``records`` counts only records whose ``job_id`` is ``job_id``;
    records of other jobs found at the same place (``other_jobs``) count for
    nothing. Frozen: any thread.
    """

    job_id: str
    #: every object key the records read refer to
    keys: frozenset[str]
    #: how many records of ``job_id`` were read (retained or superseded, any operator)
    records: int
    #: where the records were looked for (a URL or path, for messages)
    where: str
    #: ids of other jobs whose records are there (sorted)
    other_jobs: tuple[str, ...] = ()

    def check(self, job_id: str) -> None:
        """:class:`NoRecordsRead` unless at least one record of ``job_id`` was read."""
        if self.job_id == job_id and self.records >= 1:
            return
        found = (
            f"; the records there are of {'job' if len(self.other_jobs) == 1 else 'jobs'} "
            f"{', '.join(map(repr, self.other_jobs))}"
            if self.other_jobs
            else ""
        )
        raise NoRecordsRead(
            f"no checkpoint record of job {job_id!r} at {self.where}{found}: refusing to "
            "delete objects, since nothing would count as referenced (give the job's "
            "metadata_url, by default the dstl/ folder of its checkpoint_dir)"
        )


class OrphanSweeper:
    """Deletes a job's objects that nothing refers to and that are old enough.

    :meth:`sweep` lists the job's objects through the sidecar
    (``ListObjects``, paged) and deletes through it (``DiscardObjects``, at
    most :data:`DISCARD_BATCH` keys per call) every object that is

    * not in ``references.keys`` (the caller passes the keys of every
      retained and superseded checkpoint record of *every* keyed operator of
      the job), and
    * older than ``grace_s`` by its modification time at the store.

    Invariants:

    * Nothing is listed or deleted unless ``references`` holds at least one
      record of this job (:meth:`JobReferences.check`, else
      :class:`NoRecordsRead`).
    * An object in ``references.keys`` is never deleted; nor is one younger than
      ``grace_s`` or one whose age the store cannot tell (``modified`` 0).
      The age guard is what makes a sweep safe while other writers of the
      job run (a second keyed operator, a second driver): an object such a
      writer uploads for a checkpoint it has not recorded yet is young, and
      its older objects are in its retained records, which the caller
      includes in ``references``. So ``grace_s`` must exceed the longest
      time from an upload to the record that refers to it (the checkpoint
      timeout, 600 s by default) plus the clock difference between this
      machine and the store.
    * Only the sidecar touches the store, and only the job's own objects:
      the sidecar authorises every call against the client's token (a job
      token reaches only its job, else
      :class:`~dstl_client.core.errors.PermissionDenied`).
    * Memory is bounded by one page and one discard batch, not by the
      number of objects: keys are discarded while the listing goes on
      (deleting keys already listed does not disturb the paging).
    * Errors of the sidecar (:class:`~dstl_client.core.errors.DstlError`)
      propagate and end the sweep; what it deleted stays deleted and a later
      sweep picks up the rest (a sweep is idempotent), so callers treat
      cleanup as best effort: catch, log, try again at the next start.

    Thread: holds no mutable state; :meth:`sweep` may run on any thread (the
    client is thread-safe). Concurrent sweeps of one job are harmless but
    wasteful.
    """

    def __init__(
        self,
        client: ChangelogClient,
        job_id: str,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        page_size: int = 1000,
    ) -> None:
        try:
            check_job_id(job_id)
        except InvalidArgument as exc:
            raise ConfigError(exc.message) from None
        if not grace_s >= 0:
            raise ConfigError(f"grace_s={grace_s}: must be >= 0")
        if page_size < 1:
            raise ConfigError(f"page_size={page_size}: must be >= 1")
        self.client = client
        self.job_id = job_id
        self.grace_s = float(grace_s)
        self.page_size = page_size

    def unreferenced(
        self,
        references: JobReferences,
        *,
        now: float | None = None,
        listed: list[int] | None = None,
    ) -> Iterator[tuple[ObjectInfo, bool]]:
        """The job's objects not referenced, each with whether it is old enough to go.

        Lazily, a page at a time (what :meth:`sweep` deletes, and what
        ``dstl gc --dry-run`` shows). ``listed``, if given, gets its first
        element counted up per object listed. :class:`NoRecordsRead` (at
        once, before anything is listed) without a record of the job.
        """
        references.check(self.job_id)
        return self._unreferenced(references.keys, now=now, listed=listed)

    def _unreferenced(
        self, keep: frozenset[str], *, now: float | None, listed: list[int] | None
    ) -> Iterator[tuple[ObjectInfo, bool]]:
        cutoff = (time.time() if now is None else now) - self.grace_s
        for obj in self.client.list_objects(self.job_id, page_size=self.page_size):
            if listed is not None:
                listed[0] += 1
            if obj.key in keep:
                continue
            yield obj, 0 < obj.modified <= cutoff

    def sweep(self, references: JobReferences, *, now: float | None = None) -> int:
        """Delete the job's unreferenced objects older than ``grace_s``; return how many.

        ``now`` (unix seconds, default the current time) is what ages are
        measured against. :class:`NoRecordsRead` (nothing deleted) when
        ``references`` holds no record of the job.
        """
        listed = [0]
        young = deleted = 0
        batch: list[str] = []
        for obj, old in self.unreferenced(references, now=now, listed=listed):
            if not old:
                young += 1
                continue
            batch.append(obj.key)
            if len(batch) >= DISCARD_BATCH:
                deleted += self.client.discard_objects(self.job_id, batch)
                batch = []
        if batch:
            deleted += self.client.discard_objects(self.job_id, batch)
        log.info(
            "orphan sweep of job %s: %d objects listed, %d deleted (unreferenced, older "
            "than %gs), %d unreferenced but younger kept",
            self.job_id,
            listed[0],
            deleted,
            self.grace_s,
            young,
        )
        return deleted
