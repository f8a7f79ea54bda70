"""The sidecar client of a task's process: one per process and sidecar, found from the env.

* ``DSTL_ADDRESS``: the node's sidecar (``host:port`` or ``unix:///path``);
  a task prefers it to the address in the plan.
* ``DSTL_TOKEN``: the sidecar's bearer token, if it wants one.
* ``DSTL_CA_FILE``: a PEM CA bundle: the sidecar serves TLS (TCP off loopback).
* ``DSTL_STATE_DIR``: the node-local state directory; a task prefers it to the
  directory in the plan (the driver's default), so every node may keep its
  state where its own disk is.

Python workers are reused across tasks, so clients are cached per process
(a forked worker gets its own) and shared by every task of the process. The
cache is guarded by a lock: any thread may call :func:`shared_client`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from dstl_client.client import ChangelogClient
from dstl_client.core.errors import ConfigError, DstlError

if TYPE_CHECKING:
    from dstl_client.coordinator.messages import BatchPlan

#: environment variable naming the node's sidecar (``host:port`` or ``unix:///path``)
ADDRESS_ENV = "DSTL_ADDRESS"
#: environment variable with the sidecar's bearer token, if it wants one
TOKEN_ENV = "DSTL_TOKEN"
#: environment variable with a PEM CA bundle: the sidecar serves TLS (TCP off loopback)
CA_FILE_ENV = "DSTL_CA_FILE"
#: environment variable naming the node-local state directory
STATE_DIR_ENV = "DSTL_STATE_DIR"

_clients: dict[tuple[int, str, str | None, str | None], ChangelogClient] = {}
_clients_lock = threading.Lock()


def shared_client(address: str, token: str | None = None) -> ChangelogClient:
    """One client per process and sidecar (Python workers are reused across tasks)."""
    ca_file = os.environ.get(CA_FILE_ENV) or None
    key = (os.getpid(), address, token, ca_file)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            try:
                roots = Path(ca_file).read_bytes() if ca_file else None
            except OSError as exc:
                raise ConfigError(f"{CA_FILE_ENV}={ca_file!r}: cannot read: {exc}") from None
            client = ChangelogClient(address, token=token, root_certificates=roots)
            _clients[key] = client
        return client


def resolve_address(plan: BatchPlan) -> tuple[str, str | None]:
    """The sidecar of this node: ``$DSTL_ADDRESS``, else the plan's."""
    address = os.environ.get(ADDRESS_ENV) or plan.dstl_address
    if not address:
        raise ConfigError(
            f"no sidecar address: set {ADDRESS_ENV} on the executors or pass dstl_address"
        )
    token = os.environ.get(TOKEN_ENV) or plan.dstl_token
    return address, token


def resolve_state_dir(plan: BatchPlan) -> str:
    """This node's state directory: ``$DSTL_STATE_DIR``, else the plan's."""
    return os.environ.get(STATE_DIR_ENV) or plan.state_dir


def close_log(client: ChangelogClient, job_id: str, log_id: str) -> bool:
    """Close a changelog writer by its log id, best effort; whether the sidecar took it.

    Its persisted handles stay readable. A log the sidecar does not know (closed
    already, or held by another node's sidecar) is not an error.
    """
    with contextlib.suppress(DstlError):
        client.open_writer(
            job_id=job_id, log_id=log_id, key_group_range=(0, 0), max_change_bytes=1
        ).close()
        return True
    return False
