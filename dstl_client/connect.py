"""Which sidecar a process talks to, with which token: the one place and its one precedence.

Every node runs its own sidecar, and a process talks to its own node's. The
address and the token are each taken from the first of these that has one:

1. **given to this process**: an argument (``dstl_address=``, ``dstl_token=``),
   a job option (``spark.dstl.dstlAddress``, the state reader's
   ``dstlAddress``) or a command-line flag (``dstl --address``,
   ``--token-file``);
2. **this node's environment**: :data:`ADDRESS_ENV` (``DSTL_ADDRESS``),
   :data:`TOKEN_ENV` (``DSTL_TOKEN``);
3. **passed along from another node**: what a task's plan carries is the
   sidecar the driver resolved for the *driver's* node, so it yields to the
   environment of the node the task runs on;
4. none: an address is required (:func:`require_address` raises
   :class:`~dstl_client.core.errors.ConfigError`); a token is optional.

The address and the token are resolved independently. An empty value counts
as none, except a token given explicitly (``dstl_token=""`` means: no token).
:data:`CA_FILE_ENV` (``DSTL_CA_FILE``) names a PEM CA bundle: the sidecar
serves TLS (:func:`ca_file`, :func:`root_certificates`).

Pure functions of their arguments and the environment: any thread.
"""

from __future__ import annotations

import os
from pathlib import Path

from dstl_client.core.errors import ConfigError

#: environment variable naming the node's sidecar (``host:port`` or ``unix:///path``)
ADDRESS_ENV = "DSTL_ADDRESS"
#: environment variable with the sidecar's bearer token, if it wants one
TOKEN_ENV = "DSTL_TOKEN"
#: environment variable with a PEM CA bundle: the sidecar serves TLS (TCP off loopback)
CA_FILE_ENV = "DSTL_CA_FILE"


def find_address(given: str | None = None, *, passed: str | None = None) -> str:
    """The sidecar address by the module's precedence; ``""`` when there is none.

    ``given``: this process's own setting (argument, job option, flag);
    ``passed``: one resolved on another node (a task's plan).
    """
    return given or os.environ.get(ADDRESS_ENV) or passed or ""


def find_token(given: str | None = None, *, passed: str | None = None) -> str | None:
    """The sidecar token by the module's precedence; ``None`` when there is none.

    A ``given`` token is used even when empty (it says: no token); an empty
    ``$DSTL_TOKEN`` counts as unset.
    """
    if given is not None:
        return given
    return os.environ.get(TOKEN_ENV) or passed


def require_address(address: str, how: str) -> str:
    """``address``, else a :class:`ConfigError` ``no sidecar address: <how>``.

    ``how`` says where this process could be given one (it names
    :data:`ADDRESS_ENV` and the argument or flag of the caller).
    """
    if not address:
        raise ConfigError(f"no sidecar address: {how}")
    return address


def ca_file() -> str | None:
    """The PEM CA bundle :data:`CA_FILE_ENV` names (the sidecar serves TLS), or ``None``."""
    return os.environ.get(CA_FILE_ENV) or None


def root_certificates(path: str | None) -> bytes | None:
    """The PEM bundle at ``path`` (from :func:`ca_file`); ``None`` for ``None`` (plaintext)."""
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{CA_FILE_ENV}={path!r}: cannot read: {exc}") from None
