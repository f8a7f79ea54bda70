"""Where checkpoint records live: one object per checkpoint in the job's metadata store.

``<records prefix>ck-<batch id, 12 digits>.json`` in a
:class:`~dstl_client.coordinator.metadata.MetadataStore` (the prefix is
:attr:`~dstl_client.coordinator.config.CoordinatorConfig.records_prefix`,
``checkpoints/`` for the default operator). A record is written with
:meth:`~dstl_client.coordinator.metadata.MetadataStore.put_once`: a hard
link of a complete temp file on a POSIX directory, a conditional PUT
(``If-None-Match: *``) on S3. Either way a record is never overwritten (a
second write for the same batch, e.g. by another driver of the job, raises
:class:`CheckpointExists`) and a reader sees either no record or a complete
one.

The records are the driver's only durable state: a driver restarted on
another machine needs nothing but the store's URL (and credentials for S3);
the state objects themselves are in the sidecar's blob store.
"""

from __future__ import annotations

import re
from pathlib import Path

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.coordinator.metadata import (
    CorruptMetadata,
    MetadataStore,
    check_prefix,
    open_metadata_store,
)
from dstl_client.core.errors import DstlError

_NAME = re.compile(r"^ck-(\d{12})\.json$")


class CheckpointExists(DstlError):
    """A record for this batch was already written (records are never overwritten)."""

    grpc_code = "ALREADY_EXISTS"
    kind = "checkpoint_exists"


class CheckpointMissing(DstlError):
    """No record of this batch (never written, or deleted meanwhile)."""

    grpc_code = "NOT_FOUND"
    kind = "checkpoint_missing"


class CheckpointStorage:
    """Atomic, write-once checkpoint records under a prefix of a metadata store.

    ``store`` is a :class:`~dstl_client.coordinator.metadata.MetadataStore`
    (records under ``prefix``), or a path or URL of the records folder itself
    (tools reading a job's records: ``CheckpointStorage(ck / "dstl" / "checkpoints")``).

    Invariants: a record, once there, is complete and never changes until it
    is deleted; temp files are never listed as records. Thread-safety: that
    of the store (any thread); the coordinator calls it under its lock.
    """

    def __init__(
        self, store: MetadataStore | str | Path, prefix: str = "", *, fsync: bool = True
    ) -> None:
        if not isinstance(store, MetadataStore):
            store = open_metadata_store(str(store), fsync=fsync)
        self.store = store
        check_prefix(prefix)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"

    def name_of(self, batch_id: int) -> str:
        return f"{self.prefix}ck-{batch_id:012d}.json"

    def describe(self, batch_id: int) -> str:
        """Where the record of ``batch_id`` is (for messages)."""
        return self.store.describe(self.name_of(batch_id))

    def batch_ids(self) -> list[int]:
        """Batch ids of the records present, ascending."""
        out = []
        for name in self.store.list(self.prefix):
            m = _NAME.match(name[len(self.prefix) :])
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def exists(self, batch_id: int) -> bool:
        return self.store.get(self.name_of(batch_id)) is not None

    def load(self, batch_id: int) -> CheckpointRecord:
        """The record of ``batch_id``; :class:`CheckpointMissing` if there is none.

        A record that does not decode, or whose batch id is not the one its
        name says, raises :class:`~.metadata.CorruptMetadata` naming the file.
        """
        data = self.store.get(self.name_of(batch_id))
        if data is None:
            raise CheckpointMissing(
                f"no checkpoint record of batch {batch_id}: {self.describe(batch_id)}"
            )
        where = self.describe(batch_id)
        record = CheckpointRecord.from_bytes(data, where=where)
        if record.batch_id != batch_id:
            raise CorruptMetadata(
                f"{where}: holds the record of batch {record.batch_id}, not {batch_id}"
            )
        return record

    def write(self, record: CheckpointRecord) -> str:
        """Write a new record, its name; :class:`CheckpointExists` if its batch has one."""
        name = self.name_of(record.batch_id)
        if not self.store.put_once(name, record.to_bytes()):
            raise CheckpointExists(
                f"the checkpoint record of batch {record.batch_id} already exists at "
                f"{self.store.describe(name)} (records are never overwritten): another driver "
                f"of job {record.job_id!r} wrote it; is the query running twice?"
            )
        return name

    def delete(self, batch_id: int) -> None:
        self.store.delete(self.name_of(batch_id))

    def remove_temp_files(self) -> int:
        """Leftovers of writes a crash interrupted (file stores only; S3 leaves none)."""
        return self.store.remove_temp_files(self.prefix)
