"""``dstl gc``: discard the objects of a job that no checkpoint references.

Refuses (exit 2) unless at least one checkpoint record of the job was read.
Runs once per process, on the caller's thread.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any, TextIO

from dstl_client.coordinator.cleanup import DEFAULT_GRACE_S, JobReferences, OrphanSweeper
from dstl_client.coordinator.lifecycle import job_references
from dstl_client.coordinator.storage import CheckpointMissing
from dstl_client.ops import render
from dstl_client.ops.cli.parsing import leaf
from dstl_client.ops.context import JobContext


def _gc_references(ctx: JobContext, job_id: str) -> JobReferences:
    """What the job's records reference; refused (exit 2) unless one record of it was read."""
    try:
        store = ctx.store
    except CheckpointMissing:  # no such directory: no record read, and the sweep refuses
        refs = JobReferences(job_id, frozenset(), 0, f"{ctx.location} (no such directory)")
    else:
        refs = job_references(store, job_id)
    refs.check(job_id)
    return refs


def cmd_gc(ctx: JobContext, out: TextIO) -> int:
    args = ctx.args
    job_id = ctx.job_id
    refs = _gc_references(ctx, job_id)  # before the sidecar is even asked
    referenced = refs.keys
    sweeper = OrphanSweeper(ctx.client, job_id, grace_s=args.grace_s)
    now = time.time()
    if not args.dry_run:
        deleted = sweeper.sweep(refs, now=now)
        if args.json:
            render.emit_json({"job_id": job_id, "deleted": deleted}, out)
        else:
            out.write(
                f"deleted {deleted} objects of job {job_id} that no retained checkpoint "
                f"references and older than {args.grace_s:g}s\n"
            )
        return 0
    progress = render.Progress("objects listed")
    listed = [0]
    found = []
    for obj, old in sweeper.unreferenced(refs, now=now, listed=listed):
        progress.step(listed[0] - progress.n)
        found.append((obj, old))
    progress.step(listed[0] - progress.n)
    progress.done()
    if args.json:
        render.emit_json(
            {
                "job_id": job_id,
                "listed": listed[0],
                "records_read": refs.records,
                "referenced": len(referenced),
                "grace_s": args.grace_s,
                "unreferenced": [
                    {
                        "key": o.key,
                        "size_bytes": o.size,
                        "modified_unix": o.modified,
                        "would_delete": old,
                    }
                    for o, old in found
                ],
            },
            out,
        )
        return 0
    if found:
        render.table(
            ("OBJECT", "SIZE", "AGE", "ACTION"),
            [
                (
                    o.key,
                    render.size(o.size),
                    render.age(now - o.modified) if o.modified else "?",
                    "delete" if old else "keep (younger than the grace period)",
                )
                for o, old in found
            ],
            out,
        )
    doomed = sum(1 for _, old in found if old)
    out.write(
        f"{listed[0]} objects listed, {len(found)} unreferenced; {doomed} would be deleted "
        f"(dry run; grace {args.grace_s:g}s)\n"
    )
    return 0


def add_parsers(top: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """``dstl gc``."""
    p = leaf(top, "gc", cmd_gc, "discard objects no checkpoint of the job references", common)
    p.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
    p.add_argument(
        "--grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"spare objects younger than this (default {DEFAULT_GRACE_S:g})",
    )
