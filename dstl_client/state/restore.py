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
thread-safe. Rebuilding one key group's rows: :mod:`.restore_rows`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dstl_client.checkpoint.records import CheckpointRecord, Segment
from dstl_client.client import ChangelogClient
from dstl_client.core.format import ChangesetView
from dstl_client.core.handle import ChangelogHandle
from dstl_client.logs import close_log
from dstl_client.state.restore_rows import KgTail, decode_part_rows
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
            tail_of: dict[int, KgTail] = {}
            for (seg, _), fut in zip(chunk.segments, tail_reads, strict=True):
                for view in fut.result():
                    kg_tail = tail_of.get(view.key_group)
                    if kg_tail is None:
                        kg_tail = tail_of[view.key_group] = KgTail()
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
                            decode_part_rows(view.key_group, view, pid)
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
