"""``dstl objects inspect``: an object's sections, key groups and who references them.

Runs once per process, on the caller's thread.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, TextIO

from dstl_client.coordinator.storage import CheckpointMissing
from dstl_client.core.errors import ConfigError
from dstl_client.ops import render
from dstl_client.ops.cli.parsing import actions, leaf
from dstl_client.ops.context import JobContext
from dstl_client.ops.inspect import SectionInfo, inspect_file, inspect_via_sidecar, object_path


def cmd_objects_inspect(ctx: JobContext, out: TextIO) -> int:
    args = ctx.args
    job_id = ctx.job_id
    try:
        records = [(f"{x.operator_id}@{x.record.batch_id}", x.record) for x in ctx.records()]
    except CheckpointMissing:
        records = []
    # no record read: "referenced by nothing" would be a guess, not a finding
    unknown = "(unknown: no checkpoint record of the job read at " + ctx.location + ")"
    if args.storage:
        path = object_path(args.storage, job_id, args.key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointMissing(f"no object {args.key} of job {job_id} at {path}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
        sections = inspect_file(data, records, args.key)
        size, how = len(data), "every section read from the store"
    else:
        sections = inspect_via_sidecar(ctx.client, job_id, args.key, records)
        if not sections:
            raise CheckpointMissing(
                f"no record of job {job_id} names object {args.key}: its sections cannot be "
                "found through the sidecar (an orphan? see dstl gc); with --storage "
                "file:///... the object file is read directly"
            )
        size, how = None, "the sections the records name, read through the sidecar"
    if args.json:
        render.emit_json(
            {
                "job_id": job_id,
                "key": args.key,
                "size_bytes": size,
                "read": "store" if args.storage else "sidecar",
                "checksums_verified": all(s.verified for s in sections),
                "sections": [s.to_json() for s in sections],
            },
            out,
        )
        return 0
    render.fields(
        [
            ("object", args.key),
            ("size", render.size(size) if size is not None else "-"),
            ("sections", f"{len(sections)} ({how})"),
            ("checksums", "verified (CRC32C of every header and key-group block)"),
        ],
        out,
    )
    out.write("\n")
    render.table(
        ("LOG", "OFFSET", "LENGTH", "SQNS", "KEY GROUPS", "CHANGES", "BYTES", "REFERENCED BY"),
        [_section_row(s, "" if records else unknown) for s in sections],
        out,
    )
    return 0


def _kg_text(kgs: Sequence[int]) -> str:
    if not kgs:
        return "-"
    runs: list[str] = []
    start = prev = kgs[0]
    for kg in [*kgs[1:], None]:
        if kg is not None and kg == prev + 1:
            prev = kg
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if kg is not None:
            start = prev = kg
    text = ",".join(runs)
    return text if len(text) <= 24 else f"{len(kgs)} groups"


def _section_row(s: SectionInfo, unknown: str = "") -> tuple[Any, ...]:
    return (
        s.log_id[:12],
        s.offset,
        s.length,
        f"{s.first_sqn}-{s.end_sqn}",
        _kg_text(sorted(s.key_groups)),
        sum(c[1] for c in s.key_groups.values()),
        sum(c[2] for c in s.key_groups.values()),
        "; ".join(s.referenced_by) or unknown or "(none: unreferenced)",
    )


def add_parsers(top: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """``dstl objects inspect``."""
    ob_sub = actions(top, "objects", "look into the job's objects")
    p = leaf(
        ob_sub, "inspect", cmd_objects_inspect, "sections, key groups, checksums verified", common
    )
    p.add_argument("key", help="the object key (<job>/<hh>/<uuid>.dstl)")
    p.add_argument(
        "--storage",
        help="read the file from this file:///root (the sidecar's --storage) instead of "
        "through the sidecar",
    )
