"""The sidecar client of a task's process: one per process and sidecar, found from the env.

* The sidecar and its token: :mod:`dstl_client.connect` (``DSTL_ADDRESS``,
  ``DSTL_TOKEN``, ``DSTL_CA_FILE``); a task prefers its node's to the plan's.
* ``DSTL_STATE_DIR``: the node-local state directory; a task prefers it to the
  directory in the plan (the driver's default), so every node may keep its
  state where its own disk is.

Python workers are reused across tasks, so clients are cached per process
(a forked worker gets its own) and shared by every task of the process. The
cache is guarded by a lock: any thread may call :func:`shared_client`.
"""

from __future__ import annotations

import os
import threading

from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.client import ChangelogClient
from dstl_client.connect import (
    ADDRESS_ENV,
    ca_file,
    find_address,
    find_token,
    require_address,
    root_certificates,
)

#: environment variable naming the node-local state directory
STATE_DIR_ENV = "DSTL_STATE_DIR"

_clients: dict[tuple[int, str, str | None, str | None], ChangelogClient] = {}
_clients_lock = threading.Lock()


def shared_client(address: str, token: str | None = None) -> ChangelogClient:
    """One client per process and sidecar (Python workers are reused across tasks)."""
    ca = ca_file()
    key = (os.getpid(), address, token, ca)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            roots = root_certificates(ca)
            client = ChangelogClient(address, token=token, root_certificates=roots)
            _clients[key] = client
        return client


def resolve_address(plan: BatchPlan) -> tuple[str, str | None]:
    """The sidecar of this node: ``$DSTL_ADDRESS``, else the plan's (the driver's node's).

    The plan's address and token are passed along from the driver
    (:mod:`dstl_client.connect`'s rule 3), so this node's environment wins.
    """
    address = find_address(passed=plan.dstl_address)
    how = f"set {ADDRESS_ENV} on the executors or pass dstl_address"
    return require_address(address, how), find_token(passed=plan.dstl_token)


def resolve_state_dir(plan: BatchPlan) -> str:
    """This node's state directory: ``$DSTL_STATE_DIR``, else the plan's."""
    return os.environ.get(STATE_DIR_ENV) or plan.state_dir
