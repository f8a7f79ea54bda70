"""``dstl``: the operator CLI for jobs with keyed state on the DSTL (``dstl_client.ops.cli:main``).

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

One module per noun holds its commands and their flags (:mod:`.checkpoints`,
:mod:`.state`, :mod:`.objects`, :mod:`.gc`, :mod:`.config`); what they share
is in :mod:`.parsing`; this module builds the parser and runs a command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from dstl_client.coordinator.storage import CheckpointMissing
from dstl_client.core.errors import ConfigError, DstlError, InvalidArgument
from dstl_client.core.version import package_version
from dstl_client.ops.cli import checkpoints, config, gc, objects, state
from dstl_client.ops.cli.parsing import (
    EXIT_FAILED,
    EXIT_USAGE,
    PROG,
    Parser,
    sidecar_options,
    where_options,
)
from dstl_client.ops.context import JobContext


def build_parser() -> argparse.ArgumentParser:
    """The ``dstl`` parser: every command, in the order ``dstl --help`` lists them."""
    common = [where_options(), sidecar_options()]
    parser = Parser(
        prog=PROG,
        description="Operate jobs with keyed state on the DSTL: checkpoints, state, objects, "
        "and the running driver's checkpoint configuration.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    top = parser.add_subparsers(dest="group", required=True, metavar="COMMAND", parser_class=Parser)
    for noun in (checkpoints, state, objects, gc, config):
        noun.add_parsers(top, common)
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
