"""Where checkpoint records live: a directory, one file per checkpoint.

``<checkpoint_dir>/dstl/checkpoints/ck-<batch id, 12 digits>.json``. A record
is written to a unique temp file, fsynced, then *hard-linked* to its final
name: ``link`` fails when the name exists, so a record is never overwritten
(a second write for the same batch raises :class:`CheckpointExists`), and a
reader sees either no record or a complete one. The directory is fsynced
after the link and after deletions.

The directory must be a local or shared POSIX file system (like Spark's own
``checkpointLocation``); the state objects themselves are in the sidecar's
blob store (``file://`` or S3).
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from pathlib import Path

from dstl_client.coordinator.records import CheckpointRecord
from dstl_client.core.errors import DstlError

_NAME = re.compile(r"^ck-(\d{12})\.json$")


class CheckpointExists(DstlError):
    """A record for this batch was already written (records are never overwritten)."""

    grpc_code = "ALREADY_EXISTS"
    kind = "checkpoint_exists"


class CheckpointStorage:
    """Atomic, write-once checkpoint records in a directory."""

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
        tmp = self.directory / f".tmp-{uuid.uuid4().hex}"
        data = record.to_bytes()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise CheckpointExists(
                    f"checkpoint record of batch {record.batch_id} exists: {final}"
                ) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._sync_dir()
        return final

    def delete(self, batch_id: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path_of(batch_id))
        self._sync_dir()

    def remove_temp_files(self) -> int:
        """Temp files of writes a crash interrupted."""
        n = 0
        for name in os.listdir(self.directory):
            if name.startswith(".tmp-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / name)
                    n += 1
        return n

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
