"""What every ``dstl`` command line shares: the parser class, the option groups, exit codes.

A parser is built per call of :func:`~dstl_client.ops.cli.build_parser` and
used by one thread; nothing here holds state between calls.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

from dstl_client.connect import ADDRESS_ENV, TOKEN_ENV
from dstl_client.coordinator.config import DEFAULT_OPERATOR
from dstl_client.core.errors import ConfigError
from dstl_client.ops.context import REST_URL_ENV, JobContext
from dstl_client.ops.tokens import CONFIG_TOKEN_ENV, RemovedSecretFlag

PROG = "dstl"
#: usage and configuration errors
EXIT_USAGE = 2
#: operational failures
EXIT_FAILED = 1
#: the longest --timeout-s (a day: longer is a unit slip)
MAX_TIMEOUT_S = 86_400.0

#: a command: runs with the job's context, writes to ``out``, returns the exit code
Command = Callable[[JobContext, TextIO], int]


class UsageError(ConfigError):
    """A command line that cannot run as given (exit code 2)."""


class Parser(argparse.ArgumentParser):
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


def seconds(text: str) -> float:
    """A ``--timeout-s`` value: seconds, more than 0 and at most :data:`MAX_TIMEOUT_S`."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT_S:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"{text!r}: seconds, more than 0 and at most {MAX_TIMEOUT_S:g}"
        )
    return value


def where_options() -> argparse.ArgumentParser:
    """The options naming the job (every command; ``config`` needs only ``--job-id``)."""
    p = Parser(add_help=False)
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


def sidecar_options() -> argparse.ArgumentParser:
    """The options reaching a sidecar (every command but ``config``)."""
    p = Parser(add_help=False)
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
    s.add_argument("--timeout-s", type=seconds, default=30.0, help="per call (default 30)")
    return p


def driver_options() -> argparse.ArgumentParser:
    """The options reaching the driver's REST endpoint (``config``)."""
    p = Parser(add_help=False)
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
    d.add_argument("--timeout-s", type=seconds, default=30.0, help="per call (default 30)")
    return p


def actions(top: Any, name: str, help_text: str) -> Any:
    """The command group ``dstl NAME``: its subparsers, one per action."""
    group = top.add_parser(name, help=help_text)
    return group.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=Parser)


def leaf(
    sub: Any,
    name: str,
    fn: Command,
    help_text: str,
    parents: Sequence[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """The command ``NAME`` under ``sub``, running ``fn``, with the options of ``parents``."""
    p: argparse.ArgumentParser = sub.add_parser(
        name, parents=list(parents), help=help_text, description=help_text
    )
    p.set_defaults(fn=fn)
    return p
