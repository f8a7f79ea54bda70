"""The secrets ``dstl`` presents: from the environment or a file, never from a flag.

A flag's value is visible to every user of the machine (``ps``, ``/proc/*/cmdline``,
shell history), so the CLI takes a token only from a variable (``DSTL_TOKEN`` for
the sidecar, ``DSTL_CONFIG_TOKEN`` for the driver's REST endpoint) or from a file
named by a flag (``--token-file``, ``--config-token-file``); the file wins over
the variable, as a flag wins over the environment. The old ``--token`` flag is
kept only to refuse it with the way out (:class:`RemovedSecretFlag`).

Invariants: a token is at most :data:`MAX_TOKEN_BYTES` long (a larger file is
refused after reading that many bytes plus one, whatever its size), printable
ASCII without spaces (it travels in an HTTP header or gRPC metadata, so a line
break could forge another header), and never part of an error message.
Any thread; stateless.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from dstl_client.core.errors import ConfigError

#: where ``dstl config`` finds the driver's REST token by default
CONFIG_TOKEN_ENV = "DSTL_CONFIG_TOKEN"
#: the longest token accepted (tokens are well under 200 bytes; a larger file is a mistake)
MAX_TOKEN_BYTES = 4096


def _checked(token: str, where: str) -> str:
    if not token:
        raise ConfigError(f"{where}: the token is empty")
    if len(token) > MAX_TOKEN_BYTES:
        raise ConfigError(f"{where}: longer than {MAX_TOKEN_BYTES} bytes: not a token")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ConfigError(
            f"{where}: a token is printable ASCII without spaces or line breaks "
            "(one line in the file)"
        )
    return token


def read_token_file(path: str, flag: str) -> str:
    """The token in file ``path`` (surrounding whitespace, a final newline, stripped).

    :class:`ConfigError` naming ``flag`` and the path (never the content) when the
    file cannot be read, is empty, longer than :data:`MAX_TOKEN_BYTES`, or holds
    more than one token.
    """
    if not path:
        raise ConfigError(f"{flag}: names no file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{flag} {path!r}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_TOKEN_BYTES:
        raise ConfigError(f"{flag} {path!r}: longer than {MAX_TOKEN_BYTES} bytes: not a token")
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{flag} {path!r}: not an ASCII token") from None
    return _checked(text, f"{flag} {path!r}")


def resolve_token(file_path: str | None, flag: str, env: str) -> str | None:
    """The token of ``flag``'s file if given, else of variable ``env``, else ``None``."""
    if file_path is not None:
        return read_token_file(file_path, flag)
    value = os.environ.get(env, "").strip()
    return _checked(value, f"${env}") if value else None


class RemovedSecretFlag(argparse.Action):
    """A flag that once carried a secret: using it is refused, its value never echoed.

    ``replacement`` (given to ``add_argument``) says what to use instead. The
    refusal is a :class:`ConfigError` raised while parsing (exit code 2).
    """

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self.replacement: str = kwargs.pop("replacement")
        kwargs.setdefault("nargs", "?")
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        raise ConfigError(
            f"{option_string or self.option_strings[0]} was removed: a secret on the command "
            f"line is visible to every user of the machine (ps); {self.replacement}"
        )
