"""One upload of one writer's closed changesets: a log section of the next object.

:class:`UploadTask` is what a job's queue holds for a local writer (beside
sections child nodes forwarded); :class:`UploadingWriter` is all the upload
engine knows of the writer whose changesets it uploads (the writer log,
:class:`~dstl_server.log.WriterLog`, which records the outcome itself).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from dstl_client.core.format import Changeset, EncodedSection, encode_log_section
from dstl_client.core.handle import HandleEntry


class UploadingWriter(Protocol):
    """The writer of an upload, as the upload engine sees it.

    ``upload_started`` is told of a task before it is queued; ``upload_done``
    once its future completed (however), returning the bytes the writer no
    longer holds (released from the memory budget by the engine).
    """

    @property
    def log_id(self) -> str: ...

    @property
    def log_id_bytes(self) -> bytes: ...

    @property
    def job_id(self) -> str: ...

    @property
    def closed(self) -> bool:
        """Closed: its job's flushes no longer wait for its persists."""
        ...

    def upload_started(self, task: UploadTask) -> None: ...

    def upload_done(self, task: UploadTask) -> int: ...


@dataclass(slots=True, eq=False)
class UploadTask:
    """Changesets of one writer (in SQN order) that go into one log section of one object.

    Invariants: ``future`` is completed exactly once: by the scheduler with
    the entry of a complete object or with an error, or by
    :meth:`~dstl_server.uploads.Uploads.abandon`. A task made by
    :meth:`~dstl_server.uploads.Uploads.start` has every changeset in its
    writer's ``uploading`` map, mapped to it, until that completion; then the
    writer records the outcome (``upload_done``, the future's first
    done-callback, so before any persist waiting on it resumes).
    Event-loop only.
    """

    log: UploadingWriter
    changesets: list[Changeset]
    preemptive: bool
    future: asyncio.Future[HandleEntry] = field(repr=False)
    _nbytes: int = field(default=-1, repr=False)
    #: the section, once encoded (its changesets are closed: they never change)
    _encoded: EncodedSection | None = field(default=None, repr=False)

    @property
    def end_sqn(self) -> int:
        """Exclusive upper bound of the section's SQN range."""
        return self.changesets[-1].sqn + 1

    @property
    def nbytes(self) -> int:
        """Data bytes of the section's changes (its share of the object; counted once)."""
        if self._nbytes < 0:
            self._nbytes = sum(cs.nbytes for cs in self.changesets)
        return self._nbytes

    @property
    def first_sqn(self) -> int:
        return self.changesets[0].sqn

    @property
    def encoded(self) -> bool:
        return self._encoded is not None

    def encode(self) -> EncodedSection:
        """The log section (encoded on first use, then kept until the task is dropped)."""
        if self._encoded is None:
            self._encoded = encode_log_section(self.log.log_id_bytes, self.changesets, self.end_sqn)
        return self._encoded
