"""``dstl state get``: the state of one key in a checkpoint, decoded where it can be.

Runs once per process, on the caller's thread.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any, TextIO

from dstl_client.keygroups import key_group_for_key
from dstl_client.ops import render
from dstl_client.ops.cli.parsing import actions, leaf
from dstl_client.ops.context import JobContext


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


def add_parsers(top: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """``dstl state get``."""
    st_sub = actions(top, "state", "read a checkpoint's state")
    p = leaf(st_sub, "get", cmd_state_get, "the state of one key in a checkpoint", common)
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
