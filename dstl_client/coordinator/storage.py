"""Where checkpoint records live: a directory, one file per checkpoint.

``<records dir>/ck-<batch id, 12 digits>.json`` (see
:attr:`~dstl_client.coordinator.config.CoordinatorConfig.records_dir`). A
record is written with :func:`dstl_client.core.atomic.write_once`: a unique
temp file, fsynced, then *hard-linked* to its final name; ``link`` fails when
the name exists, so a record is never overwritten (a second write for the
same batch raises :class:`CheckpointExists`), and a reader sees either no
record or a complete one. The directory is fsynced after the link and after
deletions.

The directory must be a local or shared POSIX file system (like Spark's own
``checkpointLocation``); the state objects themselves are in the sidecar's
blob store (``file://`` or S3).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from dstl_client.coordinator.records import CheckpointRecord
from dstl_client.core.atomic import fsync_dir, is_temp_name, write_once
from dstl_client.core.errors import DstlError

_NAME = re.compile(r"^ck-(\d{12})\.json$")


class CheckpointExists(DstlError):
    """A record for this batch was already written (records are never overwritten)."""

    grpc_code = "ALREADY_EXISTS"
    kind = "checkpoint_exists"


class CheckpointStorage:
    """Atomic, write-once checkpoint records in a directory.

    Invariants: a record file, once there, is complete and never changes
    until it is deleted; temp files are never listed as records. Not
    thread-safe by itself: the coordinator calls it under its lock (readers
    in other processes are safe, they see whole records or none).
    """

    def __init__(self, directory: str | Path, *, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync

    def path_of(self, batch_id: int) -> Path:
        return self.directory / f"ck-{batch_id:012d}.json"

    def batch_ids(self) -> list[int]:
        """Batch ids of the records present, ascending."""
        out = []
        for name in os.listdir(self.directory):
            m = _NAME.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def exists(self, batch_id: int) -> bool:
        return self.path_of(batch_id).exists()

    def load(self, batch_id: int) -> CheckpointRecord:
        return CheckpointRecord.from_bytes(self.path_of(batch_id).read_bytes())

    def write(self, record: CheckpointRecord) -> Path:
        """Write a new record; :class:`CheckpointExists` if its batch has one."""
        final = self.path_of(record.batch_id)
        if not write_once(final, record.to_bytes(), fsync=self._fsync):
            raise CheckpointExists(f"checkpoint record of batch {record.batch_id} exists: {final}")
        return final

    def delete(self, batch_id: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path_of(batch_id))
        self._sync_dir()

    def remove_temp_files(self) -> int:
        """Temp files of writes a crash interrupted (and of older versions, ``.tmp-*``)."""
        n = 0
        for name in os.listdir(self.directory):
            if is_temp_name(name) or name.startswith(".tmp-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / name)
                    n += 1
        return n

    def _sync_dir(self) -> None:
        if self._fsync:
            fsync_dir(self.directory)
