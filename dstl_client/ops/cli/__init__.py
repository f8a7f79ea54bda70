"""``dstl``, the operator CLI: :func:`main` is the entry point (see :mod:`.main`)."""

from dstl_client.ops.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
