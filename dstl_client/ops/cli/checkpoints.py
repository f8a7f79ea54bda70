"""``dstl checkpoints``: list, show, restore and dispose of a job's checkpoints.

Each command runs once per process, on the caller's thread, with the job's
:class:`~dstl_client.ops.context.JobContext`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.coordinator.config import DEFAULT_OPERATOR, spark_location
from dstl_client.coordinator.lifecycle import dispose_job
from dstl_client.coordinator.rollback import restore_checkpoint
from dstl_client.ops import render
from dstl_client.ops.cli.parsing import UsageError, actions, leaf
from dstl_client.ops.context import RETAINED, JobContext, Listed

# ---------------------------------------------------------------- figures


def record_figures(record: CheckpointRecord) -> dict[str, int]:
    """Bytes and objects a record refers to: materialized parts, changelog, in all."""
    mat = sum(h.stored_bytes for h in record.parts.values())
    changelog = sum(s.handle.stored_bytes for s in record.segments)
    op_state = sum(h.stored_bytes for _, h in record.operator_state)
    return {
        "size_bytes": mat + changelog + op_state,
        "objects": len(record.object_keys()),
        "materialized_bytes": mat,
        "changelog_bytes": changelog,
        "operator_state_bytes": op_state,
    }


def _summary(listed: Listed) -> dict[str, Any]:
    r = listed.record
    return {
        "operator_id": listed.operator_id,
        "batch_id": r.batch_id,
        "status": listed.status,
        "created_unix": r.created_unix,
        **record_figures(r),
    }


# --------------------------------------------------------------- commands


def cmd_checkpoints_list(ctx: JobContext, out: TextIO) -> int:
    listed = [x for x in ctx.records() if ctx.args.all or x.status == RETAINED]
    if ctx.args.json:
        render.emit_json({"job_id": ctx.job_id, "checkpoints": [_summary(x) for x in listed]}, out)
        return 0
    if not listed:
        out.write(f"no checkpoints at {ctx.location}\n")
        return 0
    rows = []
    for x in listed:
        f = record_figures(x.record)
        rows.append(
            (
                x.operator_id,
                x.record.batch_id,
                x.status,
                render.when(x.record.created_unix),
                render.size(f["size_bytes"]),
                f["objects"],
                render.size(f["materialized_bytes"]),
                render.size(f["changelog_bytes"]),
            )
        )
    render.table(
        (
            "OPERATOR",
            "BATCH",
            "STATUS",
            "CREATED",
            "SIZE",
            "OBJECTS",
            "MATERIALIZED",
            "CHANGELOG",
        ),
        rows,
        out,
    )
    return 0


def cmd_checkpoints_show(ctx: JobContext, out: TextIO) -> int:
    record = ctx.record(ctx.args.batch)
    figures = record_figures(record)
    mat_kgs = sum(e.last - e.first + 1 for e in record.kg_map if e.part is not None)
    if ctx.args.json:
        render.emit_json(
            {
                "job_id": record.job_id,
                "operator_id": record.operator_id,
                "batch_id": record.batch_id,
                "created_unix": record.created_unix,
                "parallelism": record.parallelism,
                "max_parallelism": record.max_parallelism,
                "materialized_key_groups": mat_kgs,
                **figures,
                "parts": len(record.parts),
                "segments": len(record.segments),
                "subtasks": [
                    {"index": s.index, "key_groups": [s.first, s.last], "attempt": s.attempt}
                    for s in record.subtasks
                ],
                "object_keys": sorted(record.object_keys()),
                "source_progress": record.source_progress,
                "stats": None if record.stats is None else record.stats.to_json(),
            },
            out,
        )
        return 0
    render.fields(
        [
            ("job", record.job_id),
            ("operator", record.operator_id),
            ("batch", record.batch_id),
            ("created", render.when(record.created_unix)),
            ("parallelism", f"{record.parallelism} (max {record.max_parallelism} key groups)"),
            ("size", render.size(figures["size_bytes"])),
            (
                "materialized",
                f"{render.size(figures['materialized_bytes'])} in {len(record.parts)} parts, "
                f"{mat_kgs} key groups",
            ),
            (
                "changelog",
                f"{render.size(figures['changelog_bytes'])} in {len(record.segments)} segments",
            ),
            ("operator state", render.size(figures["operator_state_bytes"])),
            ("objects", figures["objects"]),
            ("source progress", _progress_line(record.source_progress)),
        ],
        out,
    )
    out.write("\n")
    render.table(
        ("SUBTASK", "KEY GROUPS", "ATTEMPT"),
        [(s.index, f"{s.first}-{s.last}", s.attempt) for s in record.subtasks],
        out,
    )
    out.write("\n")
    render.table(("OBJECT",), [(k,) for k in sorted(record.object_keys())], out)
    return 0


def _progress_line(progress: Any) -> str:
    if progress is None:
        return "-"
    if isinstance(progress, list):  # Spark's offsets log: version, metadata, one per source
        return " ".join(json.dumps(p, separators=(",", ":")) for p in progress[2:]) or "-"
    return json.dumps(progress, separators=(",", ":"))


def cmd_checkpoints_restore(ctx: JobContext, out: TextIO) -> int:
    op, _ = ctx.operator()
    args = ctx.args
    if args.no_spark:
        spark: str | None = None
    elif args.spark_checkpoint:
        spark = args.spark_checkpoint
    elif ctx.checkpoint_dir:
        spark = spark_location(ctx.checkpoint_dir, op)
    else:
        raise UsageError(
            "where is Spark's checkpoint? give --checkpoint-dir, --spark-checkpoint, or "
            "--no-spark to leave Spark's progress alone"
        )
    result = restore_checkpoint(ctx.config(op), ctx.store, args.batch, spark_dir=spark)
    if args.json:
        render.emit_json({"job_id": ctx.job_id, "operator_id": op, **result.to_json()}, out)
        return 0
    moved = ", ".join(map(str, result.superseded)) or "none"
    out.write(
        f"job {ctx.job_id} operator {op} restored to batch {result.batch_id}: the next run "
        f"resumes after it.\n"
        f"records moved aside (kept until the new run records their batch): {moved}\n"
    )
    if spark is None:
        out.write("Spark's checkpoint: left alone (--no-spark)\n")
    elif result.spark_aside:
        out.write(
            f"Spark's checkpoint: {len(result.spark_moved)} log entries of later batches "
            f"moved to {result.spark_aside}\n"
        )
    else:
        out.write("Spark's checkpoint: nothing after that batch\n")
    return 0


def cmd_checkpoints_dispose(ctx: JobContext, out: TextIO) -> int:
    args = ctx.args
    if args.operator_id is not None:
        raise UsageError("dispose acts on the whole job: leave --operator-id out")
    job_id = ctx.job_id
    listed = ctx.records()
    spark_dirs: tuple[str, ...] = ()
    if ctx.checkpoint_dir and not args.keep_spark:
        ops = {x.operator_id for x in listed} | {DEFAULT_OPERATOR}
        spark_dirs = tuple(
            d
            for d in (spark_location(ctx.checkpoint_dir, op) for op in sorted(ops))
            if Path(d).is_dir()  # a local one (a URL is never a directory here)
        )
    if not args.yes:
        what = f"{len(listed)} checkpoint records of job {job_id}"
        if args.objects:
            what += " and every object of the job"
        if spark_dirs:
            what += " and its Spark checkpoint"
        raise UsageError(f"this deletes {what}; run again with --yes to do it")
    client = ctx.client if args.objects else None
    result = dispose_job(ctx.store, job_id=job_id, client=client, spark_dirs=spark_dirs)
    if args.json:
        render.emit_json({"job_id": job_id, **result.to_json()}, out)
        return 0
    out.write(
        f"job {job_id} disposed of: {result.records} records"
        + (f", {result.objects} objects" if args.objects else "")
        + (f", Spark checkpoint {', '.join(result.spark_dirs)}" if result.spark_dirs else "")
        + " deleted\n"
    )
    return 0


def add_parsers(top: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """``dstl checkpoints list|show|restore|dispose``."""
    ck_sub = actions(top, "checkpoints", "list, show, restore, dispose of checkpoints")
    p = leaf(ck_sub, "list", cmd_checkpoints_list, "the job's checkpoints, per operator", common)
    p.add_argument("--all", action="store_true", help="superseded records (of a restore) too")
    p = leaf(ck_sub, "show", cmd_checkpoints_show, "one checkpoint in detail", common)
    p.add_argument("batch", type=int, nargs="?", help="batch id (default: the latest)")
    p = leaf(
        ck_sub,
        "restore",
        cmd_checkpoints_restore,
        "make a retained checkpoint the one a stopped job resumes from (a roll back)",
        common,
    )
    p.add_argument("batch", type=int, help="the retained batch to restore")
    p.add_argument(
        "--spark-checkpoint", help="Spark's checkpointLocation (default: from --checkpoint-dir)"
    )
    p.add_argument("--no-spark", action="store_true", help="leave Spark's checkpoint alone")
    p = leaf(
        ck_sub,
        "dispose",
        cmd_checkpoints_dispose,
        "delete every checkpoint of a stopped job (and with --objects its objects)",
        common,
    )
    p.add_argument("--yes", action="store_true", help="really delete")
    p.add_argument("--objects", action="store_true", help="discard every object of the job too")
    p.add_argument("--keep-spark", action="store_true", help="keep Spark's checkpoint folders")
