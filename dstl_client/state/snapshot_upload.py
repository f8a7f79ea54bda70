"""Writing a snapshot of key groups as one materialized part through a DSTL writer.

The rows of each key group, read from a consistent :class:`SnapshotReader`,
become PUT changes of that key group on a fresh writer; one persist makes
them a part (a handle). The caller owns the reader and the writer.

The rows go in batches of :data:`READ_ROWS` (``fetchmany``), each encoded
into one packed run (:func:`~dstl_client.state.changes.pack_puts`) and
handed to the writer whole (``append_packed``): no Python call, tuple or
copy per row beyond SQLite's own row objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from dstl_client.client import ChangelogWriter
from dstl_client.core.handle import ChangelogHandle
from dstl_client.state.changes import pack_puts
from dstl_client.state.store import SnapshotReader

#: rows read from SQLite, encoded and handed to the writer per call
READ_ROWS = 8192


@dataclass(frozen=True, slots=True)
class UploadedSnapshot:
    """A written part: its handle (None when every key group was empty) and its key groups."""

    part: ChangelogHandle | None
    #: key groups with rows, all in ``part``
    uploaded: tuple[int, ...]
    #: key groups without rows (nothing uploaded for them)
    cleared: tuple[int, ...]


def upload_snapshot(
    reader: SnapshotReader, writer: ChangelogWriter, kgs: list[int], timeout_s: float
) -> UploadedSnapshot:
    """Append every row of the key groups ``kgs`` (ascending) and persist them as one part.

    Thread: any one thread (the writer is not shared while this runs).
    """
    uploaded: list[int] = []
    cleared: list[int] = []
    for kg in kgs:
        n = 0
        for rows in reader.row_batches(kg, READ_ROWS):
            sizes, payload = pack_puts(rows)
            writer.append_packed(kg, sizes, payload)
            n += len(rows)
        (uploaded if n else cleared).append(kg)
    if not uploaded:
        return UploadedSnapshot(None, (), tuple(cleared))
    part = writer.persist_durably(after=0).result(timeout=timeout_s)
    return UploadedSnapshot(part, tuple(uploaded), tuple(cleared))
