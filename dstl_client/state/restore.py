"""Restore: rebuild a key-group range's local store as of a committed checkpoint.

Key groups are the unit: each key group's rows come from its materialized
part, then the changelog segments recorded after that materialization are
replayed in batch (and SQN) order, filtered to the store's key groups. So
any parallelism restores from any record (rescaling), and the same code
reads a whole checkpoint for tools (:func:`restore_range` over every key
group).

How (for speed; the result is the same as replaying change by change through
the keyed backend):

* the range's key groups are taken in *chunks* whose share of the part and of
  the changelog tail is about :data:`CHUNK_BYTES`, so memory stays bounded
  whatever the state's size;
* a chunk's reads (one ``ReadChanges`` stream per part and per tail segment,
  restricted to the chunk's key groups) run on :data:`READ_THREADS` threads,
  and the next chunk's reads start while this one is applied;
* the tail's reads are queued first (a tail of many checkpoints is most of
  the reads), and each tail segment is folded in, in batch order, as soon as
  it arrives, while the sidecar serves the next ones: as long as a key
  group's tail holds only PUTs (the usual case) only the last value of each
  row is kept, so changes superseded later in the tail cost a dict store;
* each key group's part rows are decoded straight from the packed payload;
  a key group with a tail is rebuilt in memory (its part rows updated with
  the folded PUTs; from a key group's first other change on, the rest of its
  tail applied in order: deletes, map clears and list appends as the backend
  applies them) and written once; one without a tail is written as read;
* the rows of a chunk go into SQLite on a writer thread (``executemany``
  releases the GIL) while the next chunk is decoded.

Runs on the task's thread (plus its reader and writer threads, which end
before it returns); the store is the task's (locked), the client is
thread-safe.
"""

from __future__ import annotations

import bisect
import logging
import struct
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dstl_client.checkpoint.records import CheckpointRecord, Segment
from dstl_client.client import ChangelogClient
from dstl_client.core.errors import CorruptObject
from dstl_client.core.format import ChangesetView
from dstl_client.core.handle import ChangelogHandle
from dstl_client.logs import close_log
from dstl_client.state.changes import (
    OP_DELETE,
    OP_DELETE_PREFIX,
    OP_LIST_APPEND,
    OP_PUT,
    decode_change,
)
from dstl_client.state.store import LocalKeyedStore
from dstl_client.state.store_dirs import remove_overlapping_stores

log = logging.getLogger(__name__)

#: a chunk of key groups holds about this many bytes of part and tail (bounds memory);
#: each tail segment is read once per chunk
CHUNK_BYTES = 64 << 20
#: a step within a chunk: about this many bytes of part rows decoded, merged, written
STEP_BYTES = 4 << 20
#: concurrent ``ReadChanges`` streams of one restore
READ_THREADS = 4
#: steps whose part reads are in flight ahead of the one being applied
READ_AHEAD = 4

Row = tuple[int, bytes, bytes | None]


@dataclass(frozen=True, slots=True)
class RestoreCounts:
    """What a restore read: rows of materialized parts, replayed changes, bytes."""

    rows: int = 0
    replayed: int = 0
    bytes: int = 0


@dataclass(slots=True)
class _Chunk:
    """Consecutive key groups of the range and the reads that rebuild them."""

    kgs: list[int]
    #: the chunk's key groups in steps; per step, (part id, its key groups in the step)
    steps: list[tuple[list[int], list[tuple[str, list[int]]]]] = field(default_factory=list)
    #: (segment, its key groups in this chunk that replay it), in batch order
    segments: list[tuple[Segment, list[int]]] = field(default_factory=list)


def _plan_chunks(
    kgs: Sequence[int],
    committed: CheckpointRecord,
    per_kg: Sequence[tuple[str | None, int]],
    tail: Sequence[Segment],
) -> list[_Chunk]:
    """The range's key groups in chunks of about :data:`CHUNK_BYTES` (estimated)."""

    def share(handle: ChangelogHandle, first: int, last: int) -> float:
        return handle.stored_bytes / max(1, last - first + 1)

    est: dict[int, tuple[float, float]] = {}
    for kg in kgs:
        pid, mat_batch = per_kg[kg]
        part = 0.0
        if pid is not None:
            h = committed.parts[pid]
            part = share(h, *h.key_group_range)
        tail_b = sum(
            share(seg.handle, seg.first, seg.last)
            for seg in tail
            if seg.first <= kg <= seg.last and mat_batch < seg.batch
        )
        est[kg] = (part, tail_b)
    chunks = []
    for group in _groups(kgs, {kg: a + b for kg, (a, b) in est.items()}, CHUNK_BYTES):
        chunk = _Chunk(group)
        for step in _groups(group, {kg: a + b for kg, (a, b) in est.items()}, STEP_BYTES):
            by_part: dict[str, list[int]] = {}
            for kg in step:
                pid = per_kg[kg][0]
                if pid is not None:
                    by_part.setdefault(pid, []).append(kg)
            chunk.steps.append((step, sorted(by_part.items())))
        for seg in tail:
            want = [kg for kg in group if seg.first <= kg <= seg.last and per_kg[kg][1] < seg.batch]
            if want:
                chunk.segments.append((seg, want))
        chunks.append(chunk)
    return chunks


def _groups(kgs: Sequence[int], est: dict[int, float], limit: float) -> list[list[int]]:
    """Consecutive key groups in groups of at most ``limit`` estimated bytes (at least one)."""
    groups: list[list[int]] = [[]]
    acc = 0.0
    for kg in kgs:
        if groups[-1] and acc + est[kg] > limit:
            groups.append([])
            acc = 0.0
        groups[-1].append(kg)
        acc += est[kg]
    return groups


def _read_all(
    client: ChangelogClient, handle: ChangelogHandle, kgs: list[int]
) -> list[ChangesetView]:
    return list(client.read_changesets(handle, kgs))


def _part_rows(kg: int, view: ChangesetView, pid: str) -> list[tuple[bytes, bytes]]:
    """The ``(k, v)`` rows of a materialized part's changeset (PUT records only)."""
    payload = view.payload
    out: list[tuple[bytes, bytes]] = []
    append = out.append
    pos = 0
    for size in struct.unpack(f"<{view.count}I", view.sizes):
        end = pos + size
        if size >= 2 and payload[pos] == OP_PUT and payload[pos + 1] < 0x80:
            ks = pos + 2
            ke = ks + payload[pos + 1]
            if ke > end:
                raise CorruptObject("state change key runs past its end")
            append((payload[ks:ke], payload[ke:end]))
        else:
            op, k, v = decode_change(payload[pos:end])
            if op != OP_PUT:
                raise CorruptObject(f"materialized part {pid} holds a change of type {op}")
            append((k, v))
        pos = end
    if pos != len(payload):
        raise CorruptObject(f"key group {kg}: sizes do not add up to the payload")
    return out


class _KgRows:
    """One key group's rows in memory while its tail is applied.

    Applies changes as :meth:`KeyedStateBackend.apply_change` does: PUT and
    DELETE of a row (map entries included), DELETE_PREFIX drops every row
    starting with the prefix (a whole map), LIST_APPEND concatenates. A sorted
    index of the row keys is built at the first prefix delete only.
    """

    __slots__ = ("index", "rows")

    def __init__(self, rows: Iterable[tuple[bytes, bytes]]) -> None:
        self.rows: dict[bytes, bytes] = dict(rows)
        self.index: list[bytes] | None = None

    def apply(self, view: ChangesetView, first: int = 0, pos: int = 0) -> None:
        """Apply the view's changes from its ``first`` one on (at byte ``pos``)."""
        rows = self.rows
        payload = view.payload
        for size in struct.unpack_from(f"<{view.count - first}I", view.sizes, 4 * first):
            end = pos + size
            if size >= 2 and payload[pos] == OP_PUT and payload[pos + 1] < 0x80:
                ks = pos + 2
                ke = ks + payload[pos + 1]
                if ke > end:
                    raise CorruptObject("state change key runs past its end")
                k = payload[ks:ke]
                if self.index is not None and k not in rows:
                    bisect.insort(self.index, k)
                rows[k] = payload[ke:end]
            else:
                self._apply_slow(payload[pos:end])
            pos = end
        if pos != len(payload):
            raise CorruptObject(f"key group {view.key_group}: sizes do not add up to the payload")

    def _apply_slow(self, data: bytes) -> None:
        op, k, value = decode_change(data)
        rows = self.rows
        if op in (OP_PUT, OP_LIST_APPEND):
            old = rows.get(k)
            if old is None and self.index is not None:
                bisect.insort(self.index, k)
            rows[k] = value if op == OP_PUT or old is None else old + value
        elif op == OP_DELETE:
            if rows.pop(k, None) is not None and self.index is not None:
                del self.index[bisect.bisect_left(self.index, k)]
        elif op == OP_DELETE_PREFIX:
            if self.index is None:
                self.index = sorted(rows)
            lo = bisect.bisect_left(self.index, k)
            hi = lo
            while hi < len(self.index) and self.index[hi].startswith(k):
                del rows[self.index[hi]]
                hi += 1
            del self.index[lo:hi]


def _fold_puts(latest: dict[bytes, bytes], view: ChangesetView) -> tuple[int, int]:
    """Fold the view's leading PUTs into ``latest`` (a later PUT of a row replaces it).

    Returns ``(changes folded, their bytes)``: ``view.count`` and the payload's
    length when every change was a PUT (of a key shorter than 128 bytes), else
    the index and offset of the first change that was not folded.
    """
    payload = view.payload
    pos = 0
    i = 0
    for size in struct.unpack(f"<{view.count}I", view.sizes):
        end = pos + size
        if size < 2 or payload[pos] != OP_PUT or payload[pos + 1] >= 0x80:
            return i, pos
        ke = pos + 2 + payload[pos + 1]
        if ke > end:
            raise CorruptObject("state change key runs past its end")
        latest[payload[pos + 2 : ke]] = payload[ke:end]
        pos = end
        i += 1
    if pos != len(payload):
        raise CorruptObject(f"key group {view.key_group}: sizes do not add up to the payload")
    return i, pos


class _KgTail:
    """One key group's changelog tail, folded as its changesets arrive (in order).

    While every change is a PUT (the usual case) only the last value of each
    row is kept (``latest``): changes a later one supersedes cost a dict
    store, and rebuilding is the part's rows updated with ``latest``. From
    the first other change on, the rest of the tail is kept (``rest``, with
    where to resume in its first changeset) and applied in order by
    :class:`_KgRows` on top of the part's rows and ``latest``.
    """

    __slots__ = ("latest", "rest")

    def __init__(self) -> None:
        self.latest: dict[bytes, bytes] = {}
        self.rest: list[tuple[ChangesetView, int, int]] = []

    def add(self, view: ChangesetView) -> None:
        if self.rest:
            self.rest.append((view, 0, 0))
            return
        done, pos = _fold_puts(self.latest, view)
        if done < view.count:
            self.rest.append((view, done, pos))

    def rebuild(self, part_rows: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The key group's rows in ``k`` order: ``part_rows`` (``k`` order) with the tail applied."""
        if not self.rest:
            merged = dict(part_rows)
            merged.update(self.latest)
            # the part's keys come first, in order, then new keys: one merge for Timsort
            return sorted(merged.items())
        rows = _KgRows(part_rows)
        rows.rows.update(self.latest)
        for view, first, pos in self.rest:
            rows.apply(view, first, pos)
        return sorted(rows.rows.items())


def restore_range(
    store: LocalKeyedStore,
    committed: CheckpointRecord,
    client: ChangelogClient,
    attempt: str = "",
) -> RestoreCounts:
    """Reset ``store`` and rebuild its key groups as of the ``committed`` checkpoint.

    Loads each key group's rows from its materialized part, then replays, in
    batch order, the changelog segments after that materialization, filtered
    to the store's key groups. The store ends at version
    ``(committed.batch_id, attempt or "restored")``.
    """
    store.reset()
    kgs = list(store.kg_range)
    per_kg = committed.mat_per_kg()
    tail = [
        seg
        for seg in sorted(committed.segments, key=lambda s: (s.batch, s.first))
        if seg.kg_range.intersection(store.kg_range) is not None
    ]
    chunks = _plan_chunks(kgs, committed, per_kg, tail)
    changed: dict[int, int] = {kg: per_kg[kg][1] for kg in kgs if per_kg[kg][0] is not None}
    rows = replayed = read_bytes = 0
    readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="dstl-restore-read")
    writer = ThreadPoolExecutor(1, thread_name_prefix="dstl-restore-write")
    pending: Future[None] | None = None

    def read(handle: ChangelogHandle, kgs: list[int]) -> Future[list[ChangesetView]]:
        return readers.submit(_read_all, client, handle, kgs)

    try:
        for chunk in chunks:
            part_reads: list[list[Future[list[ChangesetView]]]] = []

            def read_ahead(
                upto: int, chunk: _Chunk = chunk, part_reads: list[Any] = part_reads
            ) -> None:
                while len(part_reads) < min(upto, len(chunk.steps)):
                    _, parts = chunk.steps[len(part_reads)]
                    part_reads.append([read(committed.parts[pid], want) for pid, want in parts])

            # the tail's reads go first (the most reads: the sidecar's long pole), then
            # the first steps' part reads; each tail segment is folded in (batch
            # order) as soon as it arrives, and each step is rebuilt and written while
            # the sidecar serves the next steps' part reads
            tail_reads = [read(seg.handle, want) for seg, want in chunk.segments]
            read_ahead(READ_AHEAD)
            tail_of: dict[int, _KgTail] = {}
            for (seg, _), fut in zip(chunk.segments, tail_reads, strict=True):
                for view in fut.result():
                    kg_tail = tail_of.get(view.key_group)
                    if kg_tail is None:
                        kg_tail = tail_of[view.key_group] = _KgTail()
                    kg_tail.add(view)
                    read_bytes += len(view.payload)
                    replayed += view.count
                    changed[view.key_group] = seg.batch
            for i, (step, parts) in enumerate(chunk.steps):
                read_ahead(i + 1 + READ_AHEAD)
                part_rows: dict[int, list[tuple[bytes, bytes]]] = {}
                for (pid, _), fut in zip(parts, part_reads[i], strict=True):
                    for view in fut.result():
                        read_bytes += len(view.payload)
                        rows += view.count
                        part_rows.setdefault(view.key_group, []).extend(
                            _part_rows(view.key_group, view, pid)
                        )
                part_reads[i] = []
                out: list[Row] = []
                for kg in step:
                    kg_tail = tail_of.pop(kg, None)
                    if kg_tail is not None:
                        merged = kg_tail.rebuild(part_rows.pop(kg, ()))
                        out.extend((kg, k, v) for k, v in merged)
                    elif kg in part_rows:
                        out.extend((kg, k, v) for k, v in part_rows.pop(kg))
                if pending is not None:
                    pending.result()
                pending = writer.submit(store.write_main, out) if out else None
        if pending is not None:
            pending.result()
    finally:
        readers.shutdown(wait=True, cancel_futures=True)
        writer.shutdown(wait=True, cancel_futures=True)
    store.begin()
    store.mark_changed(changed)
    store.set_meta(main_version=committed.batch_id, main_attempt=attempt or "restored")
    store.commit()
    return RestoreCounts(rows=rows, replayed=replayed, bytes=read_bytes)


def restore_subtask(
    store: LocalKeyedStore,
    committed: CheckpointRecord,
    client: ChangelogClient,
    *,
    job_id: str,
    attempt: str,
) -> RestoreCounts:
    """A subtask's restore: :func:`restore_range`, then stale stores of its key groups go.

    Stores of other ranges overlapping this one (left by another parallelism)
    are deleted, and their changelog writers closed at the sidecar.
    """
    counts = restore_range(store, committed, client, attempt)
    for _path, log_id in remove_overlapping_stores(
        store.directory.parent, store.kg_range, store.directory
    ):
        if log_id:  # that range's changelog writer is no longer needed
            close_log(client, job_id, log_id)
    log.info("%s restored to batch %d: %s", store.kg_range, committed.batch_id, counts)
    return counts
