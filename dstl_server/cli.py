"""``dstl-server``: run one sidecar until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from dataclasses import MISSING, fields
from typing import Any

from dstl_client.core.errors import ConfigError
from dstl_server.settings import ServerSettings, env_name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dstl-server",
        allow_abbrev=False,  # "--auth-secret" must not silently mean "--auth-secret-file"
        description="Durable Short-term Log sidecar: batches state changes of every "
        "executor on this node into one object per flush.",
        epilog="Every flag can also be set with the DSTL_* environment variable shown; "
        "a flag wins over the environment.",
    )
    for f in fields(ServerSettings):
        if f.metadata["env_only"]:
            continue  # secrets: environment or file only, never visible in `ps`
        flag = "--" + f.name.replace("_", "-")
        unit = f" [{f.metadata['unit']}]" if f.metadata["unit"] else ""
        help_text = f"{f.metadata['doc']}{unit} (default {f.default!r}; env {env_name(f.name)})"
        default: Any = None
        if f.default is MISSING:  # pragma: no cover - every setting has a default
            raise AssertionError(f.name)
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
                flag, dest=f.name, default=default, type=type(f.default), help=help_text
            )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective settings and exit"
    )
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
    return parser


async def serve(settings: ServerSettings) -> int:
    """Run until SIGTERM/SIGINT; return how many in-flight persists shutdown cut off."""
    from dstl_server.app import DstlServer

    server = DstlServer(settings)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A line on stdout tells supervisors and tests where we listen.
    print(
        f"READY grpc={server.address} metrics_port={server.metrics_port} epoch={server.epoch}",
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    overrides = {
        k: v
        for k, v in vars(ns).items()
        if k not in ("print_config", "print_token", "print_admin_token", "print_node_token")
        and v is not None
    }
    try:
        settings = ServerSettings.from_sources(overrides)
    except ConfigError as exc:
        print(f"dstl-server: configuration error: {exc.message}", file=sys.stderr)
        return 2
    if ns.print_config:
        for f in fields(settings):
            value = getattr(settings, f.name)
            if f.metadata["env_only"] and value:
                value = "***"
            print(f"{f.name} = {value!r}")
        return 0
    if ns.print_token is not None or ns.print_admin_token or ns.print_node_token:
        from dstl_server.auth import Authenticator

        if not settings.auth_secret:
            print("dstl-server: printing a token needs an auth secret", file=sys.stderr)
            return 2
        auth = Authenticator(settings.auth_secret)
        try:
            if ns.print_node_token:
                print(auth.node_token())
            else:
                print(
                    auth.admin_token() if ns.print_admin_token else auth.job_token(ns.print_token)
                )
        except ConfigError as exc:
            print(f"dstl-server: {exc.message}", file=sys.stderr)
            return 2
        return 0
    from dstl_server.logs import setup_logging

    setup_logging(settings.log_level)
    _fix_malloc_mmap_threshold()
    try:
        import uvloop

        abandoned = uvloop.run(serve(settings))
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
