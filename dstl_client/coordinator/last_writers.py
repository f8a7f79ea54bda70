"""The changelog writers the last recorded batch left open, closed when its query stops.

A subtask's writer lives in the sidecar of the node that ran it and stays
open for the next batch (its log goes on). When the query stops, the driver
closes those it can reach (:meth:`LastWriters.close`); the others close when
idle, and a task that finds its log closed starts a new one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from dstl_client.checkpoint.messages import TaskResult
from dstl_client.client import ChangelogClient
from dstl_client.core.errors import ConfigError
from dstl_client.logs import close_log


class LastWriters:
    """The log ids of the changelog writers of the last recorded batch, by subtask.

    Invariants: holds the writers of one batch, the last recorded one (a new
    record replaces them); each is closed at most once by :meth:`close`.
    Threads: any (guarded by its own lock; the closing itself runs outside it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: subtask -> log id of its changelog writer
        self._log_ids: dict[int, str] = {}

    def recorded(self, results: Sequence[TaskResult]) -> None:
        """The batch of ``results`` was recorded: its writers are the ones left open now."""
        with self._lock:
            self._log_ids = {r.index: r.log_id for r in results if r.log_id}

    def forget(self) -> None:
        """The operator's checkpoints are gone (disposed): nothing to close."""
        with self._lock:
            self._log_ids = {}

    def close(self, client: Callable[[], ChangelogClient], job_id: str) -> int:
        """Close the writers, best effort, through ``client()`` (the driver's sidecar); how many.

        They are forgotten first, so a second call closes nothing. Only those
        in the driver's sidecar are reached (one node); without a sidecar
        address (``client()`` raises :class:`ConfigError`) none is.
        """
        with self._lock:
            log_ids = sorted(set(self._log_ids.values()))
            self._log_ids = {}
        if not log_ids:
            return 0
        try:
            sidecar = client()
        except ConfigError:
            return 0
        return sum(close_log(sidecar, job_id, log_id) for log_id in log_ids)
