"""What several sidecar test modules share: upload tasks, a batching scheduler, entry checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dstl_client.core.format import Changeset, pack_changes, parse_kg_block, parse_log_header
from dstl_client.core.handle import HandleEntry
from dstl_server.batching import BatchingScheduler
from dstl_server.log import WriterLog
from dstl_server.metrics import ServerMetrics
from dstl_server.upload_clock import Sleep
from dstl_server.upload_task import UploadTask
from tests.fakes import MemoryUploader

_sqns: dict[str, int] = {}


def make_task(wl: WriterLog, payload: bytes, *, preemptive: bool = False) -> UploadTask:
    """One changeset of ``payload`` for ``wl`` at its next SQN."""
    sqn = _sqns.get(wl.log_id, 0)
    _sqns[wl.log_id] = sqn + 1
    cs = Changeset(sqn, {wl.key_group_range[0]: [pack_changes([payload])]})
    fut: asyncio.Future[HandleEntry] = asyncio.get_running_loop().create_future()
    return UploadTask(wl, [cs], preemptive, fut)


def scheduler(
    up: MemoryUploader,
    *,
    delay_s: float = 60.0,
    threshold: int = 1 << 20,
    writers: int | Callable[[], int] = 1,
    slots: asyncio.Semaphore | None = None,
    metrics: ServerMetrics | None = None,
    job: str = "job",
    max_wait_s: float = 0.0,
    sleep: Sleep = asyncio.sleep,
) -> BatchingScheduler:
    """A scheduler of ``job``; by default it never waits past the delay (``max_wait_s`` 0)."""
    return BatchingScheduler(
        job,
        persist_delay_s=delay_s,
        max_wait_s=max_wait_s,
        sleep=sleep,
        size_threshold=threshold,
        uploader=up,
        upload_slots=slots or asyncio.Semaphore(4),
        metrics=metrics or ServerMetrics(),
        open_writers=writers if callable(writers) else (lambda: writers),
    )


def check_entry(up: MemoryUploader, task: UploadTask, entry: HandleEntry) -> bytes:
    """The entry points at ``task``'s section; returns the section's single change."""
    data = up.objects[entry.object_key]
    sec = data[entry.offset : entry.offset + entry.length]
    hdr = parse_log_header(sec, entry.length)
    assert hdr.log_id == task.log.log_id_bytes
    assert (hdr.first_sqn, hdr.end_sqn) == (entry.first_sqn, entry.end_sqn)
    assert (entry.first_sqn, entry.end_sqn) == (task.changesets[0].sqn, task.end_sqn)
    ((kg, (off, length)),) = hdr.key_groups.items()
    (view,) = parse_kg_block(kg, sec[off : off + length])
    (change,) = view.changes()
    return change
