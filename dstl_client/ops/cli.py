"""``dstl``: the operator CLI for jobs with keyed state on the DSTL.

::

    dstl checkpoints list|show N|restore N|dispose --yes [--objects]
    dstl state get --key K [--batch N] [--serializer NAME=SPEC]
    dstl objects inspect KEY [--storage file:///root]
    dstl gc [--dry-run] [--grace-s S]
    dstl config get | set NAME=VALUE...   (checkpointInterval=10s checkpointTimeout=10min ...)
    dstl --version

Every command but ``config`` takes ``--checkpoint-dir`` (the query's; the
metadata is found as the driver finds it) or ``--metadata-url``,
``--operator-id``, ``--job-id``, the sidecar's ``--address`` (``$DSTL_ADDRESS``,
``$DSTL_CA_FILE``) and ``--json``. ``config`` needs only ``--rest-url``
(``$DSTL_REST_URL``) and ``--job-id``. Secrets are never flags (a flag is
visible in ``ps``): the sidecar's token comes from ``$DSTL_TOKEN`` or
``--token-file``, the REST endpoint's from ``$DSTL_CONFIG_TOKEN`` or
``--config-token-file`` (:mod:`dstl_client.ops.tokens`). No flag may be
abbreviated (``--check`` is not ``--checkpoint-dir``). Output is a readable
table, or JSON with ``--json``; progress of long operations goes to stderr
when it is a terminal.

Errors: one line on stderr, ``dstl: error: ...``; exit code 2 for usage and
configuration errors (a bad flag, a missing ``--yes``, an unknown batch or
operator, a metadata location without a record of the job, a corrupt
checkpoint record or overrides file, named; the REST endpoint's 400, 401, 404), 1
for operational failures (the sidecar, the store, a corrupt object; the REST
endpoint's 409, 503, or no answer). ``dstl gc`` deletes nothing unless it
has read at least one checkpoint record of the job at the metadata location. Expected errors (:class:`~dstl_client.core.errors.DstlError`)
never print a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.connect import ADDRESS_ENV, TOKEN_ENV
from dstl_client.coordinator.cleanup import DEFAULT_GRACE_S, JobReferences, OrphanSweeper
from dstl_client.coordinator.config import DEFAULT_OPERATOR, spark_location
from dstl_client.coordinator.lifecycle import (
    dispose_job,
    job_references,
    restore_checkpoint,
)
from dstl_client.coordinator.overrides import FIELDS
from dstl_client.coordinator.storage import CheckpointMissing
from dstl_client.core.errors import ConfigError, DstlError, InvalidArgument
from dstl_client.core.version import package_version
from dstl_client.keygroups import key_group_for_key
from dstl_client.ops import render
from dstl_client.ops.context import REST_URL_ENV, RETAINED, JobContext, Listed
from dstl_client.ops.driver_rest import DriverEndpoint, parse_settings
from dstl_client.ops.inspect import SectionInfo, inspect_file, inspect_via_sidecar, object_path
from dstl_client.ops.tokens import CONFIG_TOKEN_ENV, RemovedSecretFlag, resolve_token

PROG = "dstl"
#: usage and configuration errors
EXIT_USAGE = 2
#: operational failures
EXIT_FAILED = 1


class UsageError(ConfigError):
    """A command line that cannot run as given (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse that never expands an abbreviated flag, with one-line errors (exit 2).

    Every parser and subparser of ``dstl`` is one (``parser_class``): an
    abbreviation is matched by the parser that reads it, so each needs
    ``allow_abbrev=False``. An unrecognized argument is named, its value never
    echoed (it may be a secret).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False  # "--check" must not silently mean "--checkpoint-dir"
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        unrecognized = "unrecognized arguments: "
        if message.startswith(unrecognized):
            words = message[len(unrecognized) :].split()
            names = [w.split("=", 1)[0] for w in words if w.startswith("-")]
            message = unrecognized + (" ".join(names) or f"{len(words)} positional value(s)")
            if names:
                message += " (flags are never abbreviated)"
        raise UsageError(f"{message} (see {self.prog} --help)")


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


def cmd_state_get(ctx: JobContext, out: TextIO) -> int:
    from dstl_client.coordinator.state_schemas import load_schemas
    from dstl_client.ops.serde import serializers
    from dstl_client.spark.state_reader import iter_record_rows

    args = ctx.args
    specs = serializers(args.serializer or (), args.serializers)
    record = ctx.record(args.batch)
    # the states' recorded schemas decode them (typed), unless --serializer names them
    schemas = (
        None
        if record.state_schema is None
        else load_schemas(ctx.store, ctx.operator()[1], record.state_schema)
    )
    kg = key_group_for_key(args.key, record.max_parallelism)
    rows = [
        r
        for r in iter_record_rows(
            record, ctx.client, serializers=specs, key_groups=[kg], schemas=schemas
        )
        if r.key == args.key
    ]
    if args.json:
        render.emit_json(
            {
                "job_id": record.job_id,
                "operator_id": record.operator_id,
                "batch_id": record.batch_id,
                "key": args.key,
                "key_group": kg,
                "states": [
                    {
                        "state": r.state_name,
                        "kind": r.state_kind,
                        "user_key": _json_value(r.user_key_json),
                        "value": _json_value(r.value_json),
                        "expiry_ms": r.expiry_ms,
                        "user_key_hex": None
                        if r.user_key_bytes is None
                        else r.user_key_bytes.hex(),
                        "value_hex": r.value_bytes.hex(),
                    }
                    for r in rows
                ],
            },
            out,
        )
        return 0
    if not rows:
        out.write(
            f"no state of key {args.key!r} (key group {kg}) in batch {record.batch_id} of "
            f"operator {record.operator_id}\n"
        )
        return 0
    render.table(
        ("STATE", "KIND", "USER KEY", "VALUE"),
        [
            (
                r.state_name,
                r.state_kind or "?",
                "" if r.user_key_bytes is None else _shown(r.user_key, r.user_key_json),
                _shown(r.value, r.value_json),
            )
            for r in rows
        ],
        out,
    )
    if any(not r.value_decoded for r in rows):
        out.write("(0x...: raw bytes; name a serializer with --serializer NAME=SPEC)\n")
    return 0


def _json_value(text: str | None) -> Any:
    """A decoded value as JSON (structs as objects, times as ISO text), ``None`` if undecoded."""
    return None if text is None else json.loads(text)


def _shown(value: Any, decoded: str | None) -> str:
    """The decoded value's JSON text, or the first bytes in hex."""
    if decoded is not None:
        return decoded
    raw = bytes(value)
    text = raw[:32].hex()
    return f"0x{text}{'...' if len(raw) > 32 else ''}"


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


# ----------------------------------------------------------------- config


def _endpoint(ctx: JobContext) -> DriverEndpoint:
    """The driver's REST endpoint of the job: ``--rest-url`` (or ``$DSTL_REST_URL``), the token."""
    args = ctx.args
    base = args.rest_url or os.environ.get(REST_URL_ENV, "")
    if not base:
        raise UsageError(
            f"where is the driver? give --rest-url http://HOST:PORT (the query's config_port) "
            f"or set {REST_URL_ENV}"
        )
    token = resolve_token(args.config_token_file, "--config-token-file", CONFIG_TOKEN_ENV)
    return DriverEndpoint(base, ctx.job_id, token, args.timeout_s)


def _duration_text(ms: Any) -> str:
    if not isinstance(ms, int) or isinstance(ms, bool):
        return str(ms)
    if ms == 0:
        return "0"
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms} ({ms // size}{unit})"
    return f"{ms} ({ms}ms)"


def _show_config(ctx: JobContext, doc: dict[str, Any], out: TextIO) -> int:
    if ctx.args.json:
        render.emit_json(doc, out)
        return 0
    sources = doc.get("sources")
    sources = sources if isinstance(sources, dict) else {}
    known = [f for f in FIELDS if f in doc]
    rest = [k for k in sorted(doc) if k not in known and k != "sources"]
    render.fields([(k, doc[k]) for k in rest], out)
    out.write("\n")
    render.table(
        ("SETTING", "MS", "SOURCE"),
        [(f, _duration_text(doc[f]), sources.get(f, "?")) for f in known],
        out,
    )
    return 0


def cmd_config_get(ctx: JobContext, out: TextIO) -> int:
    return _show_config(ctx, _endpoint(ctx).get(), out)


def cmd_config_set(ctx: JobContext, out: TextIO) -> int:
    body = parse_settings(ctx.args.settings)
    return _show_config(ctx, _endpoint(ctx).patch(body), out)


# ----------------------------------------------------------------- parser


#: the longest --timeout-s (a day: longer is a unit slip)
MAX_TIMEOUT_S = 86_400.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT_S:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"{text!r}: seconds, more than 0 and at most {MAX_TIMEOUT_S:g}"
        )
    return value


def _where() -> argparse.ArgumentParser:
    """The options naming the job (every command; ``config`` needs only ``--job-id``)."""
    p = _Parser(add_help=False)
    g = p.add_argument_group("where the job is")
    g.add_argument(
        "--checkpoint-dir",
        help="the query's checkpoint_dir (metadata at <dir>/dstl, Spark's at <dir>/spark)",
    )
    g.add_argument("--metadata-url", help="the job's metadata_url (a path, file:// or s3://)")
    g.add_argument("--metadata-s3-endpoint-url", default="")
    g.add_argument("--metadata-s3-region", default="")
    g.add_argument(
        "--operator-id",
        default=None,
        help=f"the keyed operator (default: {DEFAULT_OPERATOR!r}; list: all of them)",
    )
    g.add_argument("--job-id", help="the job's id (default: from its records)")
    p.add_argument("--json", action="store_true", help="JSON output for scripts")
    return p


def _sidecar() -> argparse.ArgumentParser:
    """The options reaching a sidecar (every command but ``config``)."""
    p = _Parser(add_help=False)
    s = p.add_argument_group("the sidecar")
    s.add_argument("--address", help=f"host:port or unix:///path (default: ${ADDRESS_ENV})")
    s.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"a file holding the job or admin token (default: ${TOKEN_ENV}; never a flag)",
    )
    s.add_argument(
        "--token",
        action=RemovedSecretFlag,
        replacement=f"set {TOKEN_ENV} or give --token-file PATH",
    )
    s.add_argument("--timeout-s", type=_seconds, default=30.0, help="per call (default 30)")
    return p


def _driver() -> argparse.ArgumentParser:
    """The options reaching the driver's REST endpoint (``config``)."""
    p = _Parser(add_help=False)
    d = p.add_argument_group("the driver's REST endpoint")
    d.add_argument("--rest-url", help=f"http://HOST:PORT of the driver (default: ${REST_URL_ENV})")
    d.add_argument(
        "--config-token-file",
        metavar="PATH",
        help=f"a file holding the endpoint's config_token (default: ${CONFIG_TOKEN_ENV}; "
        "needed off loopback; never a flag)",
    )
    d.add_argument(
        "--config-token",
        action=RemovedSecretFlag,
        replacement=f"set {CONFIG_TOKEN_ENV} or give --config-token-file PATH",
    )
    d.add_argument("--timeout-s", type=_seconds, default=30.0, help="per call (default 30)")
    return p


Command = Callable[[JobContext, TextIO], int]


def build_parser() -> argparse.ArgumentParser:
    common = [_where(), _sidecar()]
    parser = _Parser(
        prog=PROG,
        description="Operate jobs with keyed state on the DSTL: checkpoints, state, objects, "
        "and the running driver's checkpoint configuration.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    top = parser.add_subparsers(
        dest="group", required=True, metavar="COMMAND", parser_class=_Parser
    )

    def leaf(
        sub: Any,
        name: str,
        fn: Command,
        help_text: str,
        parents: Sequence[argparse.ArgumentParser] = common,
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name, parents=list(parents), help=help_text, description=help_text
        )
        p.set_defaults(fn=fn)
        return p

    ck = top.add_parser("checkpoints", help="list, show, restore, dispose of checkpoints")
    ck_sub = ck.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    p = leaf(ck_sub, "list", cmd_checkpoints_list, "the job's checkpoints, per operator")
    p.add_argument("--all", action="store_true", help="superseded records (of a restore) too")
    p = leaf(ck_sub, "show", cmd_checkpoints_show, "one checkpoint in detail")
    p.add_argument("batch", type=int, nargs="?", help="batch id (default: the latest)")
    p = leaf(
        ck_sub,
        "restore",
        cmd_checkpoints_restore,
        "make a retained checkpoint the one a stopped job resumes from (a roll back)",
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
    )
    p.add_argument("--yes", action="store_true", help="really delete")
    p.add_argument("--objects", action="store_true", help="discard every object of the job too")
    p.add_argument("--keep-spark", action="store_true", help="keep Spark's checkpoint folders")

    st = top.add_parser("state", help="read a checkpoint's state")
    st_sub = st.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    p = leaf(st_sub, "get", cmd_state_get, "the state of one key in a checkpoint")
    p.add_argument("--key", required=True, help="the key (as text: 42 and '42' are one key)")
    p.add_argument("--batch", type=int, help="batch id (default: the latest)")
    p.add_argument(
        "--serializer",
        action="append",
        metavar="NAME=SPEC",
        help="decode state NAME: int64, float64, bool, str, bytes, json, a,b (a tuple), "
        "list:S, reducing:S, map:K:V (pickle is not offered: unpickling runs code)",
    )
    p.add_argument(
        "--serializers", metavar="MODULE:ATTR", help="the job's own {state name: serializer}"
    )

    ob = top.add_parser("objects", help="look into the job's objects")
    ob_sub = ob.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    p = leaf(ob_sub, "inspect", cmd_objects_inspect, "sections, key groups, checksums verified")
    p.add_argument("key", help="the object key (<job>/<hh>/<uuid>.dstl)")
    p.add_argument(
        "--storage",
        help="read the file from this file:///root (the sidecar's --storage) instead of "
        "through the sidecar",
    )

    p = leaf(top, "gc", cmd_gc, "discard objects no checkpoint of the job references")
    p.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
    p.add_argument(
        "--grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"spare objects younger than this (default {DEFAULT_GRACE_S:g})",
    )

    cf = top.add_parser("config", help="the running driver's checkpoint configuration (REST)")
    cf_sub = cf.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_Parser)
    driver = [_where(), _driver()]
    leaf(cf_sub, "get", cmd_config_get, "the values in force and their sources", driver)
    p = leaf(
        cf_sub,
        "set",
        cmd_config_set,
        "change checkpointInterval / checkpointTimeout / materializationInterval",
        driver,
    )
    p.add_argument(
        "settings",
        nargs="+",
        metavar="NAME=VALUE",
        help="checkpointInterval, checkpointTimeout or materializationInterval = a duration: "
        "500ms, 5s, 10min, 2h, or plain milliseconds",
    )
    return parser


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run one command; its exit code (0, 1 operational failure, 2 usage or configuration)."""
    out = out or sys.stdout
    err = err or sys.stderr
    ctx: JobContext | None = None
    try:
        args = build_parser().parse_args(argv)
        ctx = JobContext(args)
        code: int = args.fn(ctx, out)
        return code
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except (ConfigError, InvalidArgument, CheckpointMissing) as exc:
        err.write(f"{PROG}: error: {exc}\n")
        return EXIT_USAGE
    except (DstlError, OSError) as exc:
        err.write(f"{PROG}: error: {exc}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        err.write(f"{PROG}: interrupted\n")
        return 130
    finally:
        if ctx is not None:
            ctx.close()


if __name__ == "__main__":
    sys.exit(main())
