"""Writing a snapshot of key groups as one materialized part through a DSTL writer.

The rows of each key group, read from a consistent :class:`SnapshotReader`,
become PUT changes of that key group on a fresh writer; one persist makes
them a part (a handle). The caller owns the reader and the writer.

The rows go in batches of :data:`READ_ROWS` (``fetchmany``), each encoded
into one packed run (:func:`~dstl_client.state.changes.pack_puts`) and
handed to the writer whole (``append_packed``): no Python call, tuple or
copy per row beyond SQLite's own row objects.

Reading and packing run on a thread of their own, up to ``read_ahead``
batches (:data:`READ_AHEAD_BATCHES` by default) ahead of the appends: while
an append waits for the sidecar's answer, the next batches are read and
packed, so several parts of one subtask are on their way at once. The
batches held in memory are bounded by ``read_ahead + 2`` (queued, being
appended, being packed).
"""

from __future__ import annotations

import queue
import threading
from array import array
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from dstl_client.client import ChangelogWriter
from dstl_client.core.handle import ChangelogHandle
from dstl_client.state.changes import pack_puts
from dstl_client.state.store import SnapshotReader

#: rows read from SQLite, encoded and handed to the writer per call
READ_ROWS = 8192
#: packed batches read ahead of the appends (default of ``upload_snapshot``'s
#: ``read_ahead``; 0 reads each batch only when the previous one is appended)
READ_AHEAD_BATCHES = 2


@dataclass(frozen=True, slots=True)
class UploadedSnapshot:
    """A written part: its handle (None when every key group was empty) and its key groups."""

    part: ChangelogHandle | None
    #: key groups with rows, all in ``part``
    uploaded: tuple[int, ...]
    #: key groups without rows (nothing uploaded for them)
    cleared: tuple[int, ...]


#: one packed batch: key group, sizes, payload
Batch = tuple[int, "array[int]", bytes]


def _packed(reader: SnapshotReader, kgs: list[int]) -> Generator[Batch, None, None]:
    for kg in kgs:
        for rows in reader.row_batches(kg, READ_ROWS):
            sizes, payload = pack_puts(rows)
            yield kg, sizes, payload


class _ReadAhead:
    """The packed batches of ``kgs``, read and packed on a thread up to ``depth`` ahead.

    Invariants: the batches come in the order :func:`_packed` yields them;
    the thread is the only user of the reader from :meth:`start` until
    :meth:`close` returns (which joins it). The thread checks for a stop
    before every put, so once :meth:`close` has asked it to stop it puts at
    most one item, and :meth:`close` empties the queue after asking: that put
    never blocks, and the join ends. An error of the thread is raised by the
    iteration.
    Threads: :meth:`start`, the iteration and :meth:`close` on one thread
    (the materialization's).
    """

    def __init__(self, reader: SnapshotReader, kgs: list[int], depth: int) -> None:
        self._batches = _packed(reader, kgs)
        #: batches, then None (the end) or the thread's error
        self._queue: queue.Queue[Batch | BaseException | None] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dstl-snapshot-read", daemon=True)

    def start(self) -> _ReadAhead:
        self._thread.start()
        return self

    def _put(self, item: Batch | BaseException | None) -> bool:
        """Queue ``item`` unless asked to stop (checked before every put: see the class)."""
        if self._stop.is_set():
            return False
        self._queue.put(item)
        return True

    def _run(self) -> None:
        try:
            for batch in self._batches:
                if not self._put(batch):
                    return
            self._put(None)
        except BaseException as exc:  # handed to the iterating thread
            self._put(exc)
        finally:
            self._batches.close()  # the cursor, on the thread that used it

    def __iter__(self) -> Iterator[Batch]:
        while (item := self._queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the thread (when it is still reading) and wait for it."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()


def upload_snapshot(
    reader: SnapshotReader,
    writer: ChangelogWriter,
    kgs: list[int],
    timeout_s: float,
    *,
    read_ahead: int = READ_AHEAD_BATCHES,
) -> UploadedSnapshot:
    """Append every row of the key groups ``kgs`` (ascending) and persist them as one part.

    ``read_ahead``: packed batches read ahead of the appends, on a thread of
    its own (0: none, all on the calling thread). Thread: any one thread (the
    writer and the reader are not shared while this runs; the reader is not
    in use once it returns).
    """
    with_rows: set[int] = set()
    if read_ahead > 0:
        ahead = _ReadAhead(reader, kgs, read_ahead).start()
        try:
            for kg, sizes, payload in ahead:
                writer.append_packed(kg, sizes, payload)
                with_rows.add(kg)
        finally:
            ahead.close()
    else:
        for kg, sizes, payload in _packed(reader, kgs):
            writer.append_packed(kg, sizes, payload)
            with_rows.add(kg)
    uploaded = tuple(kg for kg in kgs if kg in with_rows)
    cleared = tuple(kg for kg in kgs if kg not in with_rows)
    if not uploaded:
        return UploadedSnapshot(None, (), cleared)
    part = writer.persist_durably(after=0).result(timeout=timeout_s)
    return UploadedSnapshot(part, uploaded, cleared)
