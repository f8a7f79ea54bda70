"""``dstl-server``: run one sidecar until SIGTERM/SIGINT; ``dstl-server health``: probe one.

Only the standard library is imported at module level: ``dstl-server health``
(:mod:`dstl_server.health_probe`, the chart's exec probe) dispatches before
anything else is imported, so a probe costs an interpreter and no grpcio.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from dstl_server.settings import ServerSettings

#: the logger's name (``logging`` is imported when the server starts, not for a probe)
LOGGER = __name__


class _Parser(argparse.ArgumentParser):
    """argparse with errors on one line (no usage block): exit 2, like every config error."""

    def error(self, message: str) -> NoReturn:
        # "argument --x: --x='v': expected ..." -> "--x='v': expected ..."
        message = re.sub(r"^argument [^:]+: (?=--)", "", message)
        unrecognized = "unrecognized arguments: "
        if message.startswith(unrecognized):  # name the options, never echo values (secrets)
            words = message[len(unrecognized) :].split()
            names = [w.split("=", 1)[0] for w in words if w.startswith("-")]
            message = unrecognized + (" ".join(names) or f"{len(words)} positional value(s)")
        self.exit(2, f"{self.prog}: configuration error: {message} (see {self.prog} --help)\n")


def _flag_value(name: str, raw: str) -> Any:
    from dstl_client.core.errors import ConfigError
    from dstl_server.settings import flag_name, parse_value

    try:
        return parse_value(name, raw, flag_name(name))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def build_parser() -> argparse.ArgumentParser:
    from dataclasses import MISSING, fields

    from dstl_client.core.version import package_version
    from dstl_server.settings import ServerSettings, env_name, flag_name, format_size, is_size

    parser = _Parser(
        prog="dstl-server",
        allow_abbrev=False,  # "--auth-secret" must not silently mean "--auth-secret-file"
        description="Durable Short-term Log sidecar: batches state changes of every "
        "executor on this node into one object per flush.",
        epilog="Every flag can also be set with the DSTL_* environment variable shown; "
        "a flag wins over the environment. 'dstl-server health --help': one gRPC health "
        "check of a running sidecar (exit 0 when SERVING), for exec probes.",
    )
    for f in fields(ServerSettings):
        if f.metadata["env_only"]:
            continue  # secrets: environment or file only, never visible in `ps`
        flag = flag_name(f.name)
        if f.default is MISSING:  # pragma: no cover - every setting has a default
            raise AssertionError(f.name)
        unit = f" [{f.metadata['unit']}]" if f.metadata["unit"] else ""
        default_text = repr(f.default)
        if is_size(f.name):
            unit, default_text = (
                " [bytes; units: KiB, MiB, GiB, KB, MB, GB]",
                format_size(f.default),
            )
        help_text = f"{f.metadata['doc']}{unit} (default {default_text}; env {env_name(f.name)})"
        default: Any = None
        if isinstance(f.default, bool):
            parser.add_argument(
                flag,
                dest=f.name,
                default=default,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                default=default,
                type=functools.partial(_flag_value, f.name),
                metavar=f.name.upper(),
                help=help_text,
            )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective settings and exit"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument(
        "--print-token",
        metavar="JOB_ID",
        help="print the token of job JOB_ID derived from the configured auth secret, and exit",
    )
    parser.add_argument(
        "--print-admin-token",
        action="store_true",
        help="print the operator's admin token derived from the configured auth secret, and exit",
    )
    parser.add_argument(
        "--print-node-token",
        action="store_true",
        help="print the node token (a child presents it to its parent; see parent_token_file) "
        "derived from the configured auth secret, and exit",
    )
    parser.add_argument(
        "--ttl",
        metavar="DURATION",
        type=_ttl,
        help="with --print-*-token: the token expires this long from now (seconds, or a "
        "number with s, m, h or d: 3600, 12h, 30d); default: it never expires",
    )
    return parser


#: the longest --ttl (a token's expiry must fit its 12 digits with room to spare)
MAX_TTL_S = 100 * 365 * 86400


def _ttl(raw: str) -> float:
    # not at module level: a health probe imports no dstl_client (and no grpcio) at all
    from dstl_client.core.durations import parse_duration
    from dstl_client.core.errors import InvalidArgument

    refused = argparse.ArgumentTypeError(
        f"--ttl={raw!r}: expected a duration above 0 and at most 100 years "
        "(seconds, or a number with s, m, h or d: 3600, 12h, 30d)"
    )
    try:
        seconds = parse_duration(
            raw, bare_unit="s", units=("s", "m", "h", "d"), what="--ttl"
        ).seconds
    except InvalidArgument:
        raise refused from None
    if not 0 < seconds <= MAX_TTL_S:
        raise refused
    return seconds


async def serve(settings: ServerSettings) -> int:
    """Run until SIGTERM/SIGINT; return how many in-flight persists shutdown cut off."""
    import asyncio
    import gc
    import signal

    from dstl_server.app import DstlServer

    server = DstlServer(settings)
    await server.start()  # a store that refuses us (no bucket, bad credentials): ConfigError
    # Everything built so far (modules, the S3 client's models, gRPC) lives as long as
    # the process: out of the collector's sight, a full collection scans only what
    # serving made (64-writer bench: its pauses 19-21 ms -> at most 2 ms).
    gc.freeze()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A line on stdout tells supervisors and tests where we listen; store=down when
    # the store did not answer the start probe (health: NOT_SERVING until it does).
    print(
        f"READY grpc={server.address} metrics_port={server.metrics_port} epoch={server.epoch} "
        f"store={'up' if server.store_up else 'down'} auth={'off' if server.auth is None else 'on'}",
        flush=True,
    )
    await stop.wait()
    return await server.stop()


def _fix_malloc_mmap_threshold() -> None:
    """Keep large buffers (requests, objects) on mmap so that freeing them returns memory.

    glibc raises its mmap threshold each time a large mmapped block is freed,
    after which MiB-sized buffers land in the heap arenas, fragment them, and
    RSS creeps up under sustained appends (measured: 300+ MiB instead of about
    110 MiB with a fixed 128 KiB threshold, same throughput). An explicit
    ``MALLOC_MMAP_THRESHOLD_`` in the environment wins; non-glibc: no-op.
    """
    import ctypes
    import ctypes.util
    import os

    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, no dynamic raise
    except (OSError, AttributeError):
        pass


def _unknown_text(var: str, close: str) -> str:
    hint = f"; did you mean {close}?" if close else ""
    return f"unknown environment variable {var} ignored (not a dstl setting{hint})"


def _print_token(ns: argparse.Namespace, settings: ServerSettings) -> int:
    """Print the asked-for token of the current secret (expiring with ``--ttl``); exit code."""
    from dstl_client.core.errors import ConfigError
    from dstl_server.auth import Authenticator, expiry_after

    if not settings.auth_secret:
        print(
            "dstl-server: printing a token needs an auth secret "
            "(DSTL_AUTH_SECRET or --auth-secret-file)",
            file=sys.stderr,
        )
        return 2
    auth = Authenticator(settings.auth_secret)
    try:
        expires = None if ns.ttl is None else expiry_after(ns.ttl)
        if ns.print_node_token:
            token = auth.node_token(expires_at=expires)
        elif ns.print_admin_token:
            token = auth.admin_token(expires_at=expires)
        else:
            token = auth.job_token(ns.print_token, expires_at=expires)
    except ConfigError as exc:
        print(f"dstl-server: {exc.message}", file=sys.stderr)
        return 2
    print(token)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["health"]:  # before any import beyond the standard library
        from dstl_server.health_probe import main as health_main

        return health_main(args[1:])
    import logging
    from dataclasses import fields

    from dstl_client.core.errors import ConfigError
    from dstl_server.settings import ServerSettings, unknown_environment

    log = logging.getLogger(LOGGER)
    parser = build_parser()
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:  # --help, --version (0) or a bad flag (2, one line printed)
        return exc.code if isinstance(exc.code, int) else 2
    overrides = {
        k: v
        for k, v in vars(ns).items()
        if k not in ("print_config", "print_token", "print_admin_token", "print_node_token", "ttl")
        and v is not None
    }
    try:
        settings = ServerSettings.from_sources(overrides)
    except ConfigError as exc:
        print(f"dstl-server: configuration error: {exc.message}", file=sys.stderr)
        return 2
    unknown = unknown_environment()
    if ns.print_config:
        for var, close in unknown:
            print(f"dstl-server: warning: {_unknown_text(var, close)}", file=sys.stderr)
        for f in fields(settings):
            value = getattr(settings, f.name)
            if f.metadata["env_only"] and value:
                value = "***"
            print(f"{f.name} = {value!r}")
        return 0
    if ns.print_token is not None or ns.print_admin_token or ns.print_node_token:
        return _print_token(ns, settings)
    if ns.ttl is not None:
        print(
            "dstl-server: configuration error: --ttl goes with --print-token, "
            "--print-admin-token or --print-node-token",
            file=sys.stderr,
        )
        return 2
    from dstl_server.logs import setup_logging

    setup_logging(settings.log_level)
    for var, close in unknown:
        log.warning(
            "%s", _unknown_text(var, close), extra={"fields": {"variable": var, "closest": close}}
        )
    _fix_malloc_mmap_threshold()
    try:
        import uvloop

        abandoned = uvloop.run(serve(settings))
    except ConfigError as exc:  # found at start: the store refused the start-up check
        print(f"dstl-server: configuration error: {exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"dstl-server: cannot start: {exc}", file=sys.stderr)
        return 1
    if abandoned:
        print(
            f"dstl-server: shutdown cut off {abandoned} in-flight persist(s) "
            f"(shutdown_grace_s={settings.shutdown_grace_s:g} ran out); their callers got "
            "SHUTTING_DOWN",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
