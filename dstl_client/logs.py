"""Changelogs by their log id, outside a writer: closing one an earlier run left open.

Stateless; any thread (the client it is given is thread-safe).
"""

from __future__ import annotations

import contextlib

from dstl_client.client import ChangelogClient
from dstl_client.core.errors import DstlError


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
