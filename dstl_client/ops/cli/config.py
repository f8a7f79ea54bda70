"""``dstl config get|set``: the running driver's checkpoint configuration, over REST.

Needs only the driver's endpoint and the job id (no sidecar, no metadata).
Runs once per process, on the caller's thread.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any, TextIO

from dstl_client.coordinator.overrides import FIELDS
from dstl_client.ops import render
from dstl_client.ops.cli.parsing import UsageError, actions, driver_options, leaf, where_options
from dstl_client.ops.context import REST_URL_ENV, JobContext
from dstl_client.ops.driver_rest import DriverEndpoint, parse_settings
from dstl_client.ops.tokens import CONFIG_TOKEN_ENV, resolve_token

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


def add_parsers(top: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """``dstl config get|set`` (their options: :func:`driver_options`, not ``common``)."""
    cf_sub = actions(top, "config", "the running driver's checkpoint configuration (REST)")
    driver = [where_options(), driver_options()]
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
