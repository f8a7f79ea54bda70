"""A running keyed query: the Spark query, its coordinator, its statistics."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dstl_client.coordinator.config import url_scheme
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.coordinator.stats import CheckpointStats
from dstl_client.core.errors import DstlError

log = logging.getLogger(__name__)


class QueryStopping(DstlError):
    """Raised into Spark for a batch that starts while :meth:`DstlQuery.stop` runs."""

    kind = "query_stopping"


class DstlQuery:
    """A running keyed query: the Spark query, its coordinator and statistics.

    Invariants: at most one batch runs at a time (``in_batch``); once
    :meth:`stop` began, no batch starts. Threads: the user's thread calls
    :meth:`stop` and the waits; Spark's ``foreachBatch`` thread runs batches.
    """

    def __init__(self, coordinator: CheckpointCoordinator, metrics_port: int | None) -> None:
        self.coordinator = coordinator
        self.metrics_port = metrics_port
        self.query: Any = None
        self.in_batch = threading.Lock()
        self.stopping = False
        self.config_server: CheckpointConfigServer | None = None

    @property
    def history(self) -> list[CheckpointStats]:
        """Per-checkpoint statistics (see :meth:`CheckpointCoordinator.complete_batch`)."""
        return list(self.coordinator.history)

    @property
    def last_batch_id(self) -> int:
        latest = self.coordinator.latest
        return -1 if latest is None else latest.batch_id

    def wait_for_batch(self, batch_id: int, timeout_s: float = 300.0) -> None:
        """Block until the checkpoint of ``batch_id`` (or a later one) is recorded."""
        deadline = time.monotonic() + timeout_s
        while self.last_batch_id < batch_id:
            if self.query is not None and not self.query.isActive:
                exc = self.query.exception()
                raise RuntimeError(f"the query stopped: {exc}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} not checkpointed in {timeout_s}s")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop the query between two batches, close its writers, release the coordinator.

        A running batch is let finish (up to ``timeout_s``); a batch that
        starts after this call does nothing and fails the query with
        :class:`QueryStopping`, so it is not committed and runs again on the
        next start (stopping Spark in the middle of a batch is noisy). Once
        Spark stopped, the changelog writers of the last recorded batch are
        closed at the sidecar (see
        :meth:`~dstl_client.coordinator.coordinator.CheckpointCoordinator.close_writers`).
        """
        self.stopping = True
        if self.query is not None:
            if self.in_batch.acquire(timeout=timeout_s):
                self.in_batch.release()
            self.query.stop()
        if self.config_server is not None:
            self.config_server.close()
            self.config_server = None
        try:
            closed = self.coordinator.close_writers()
            if closed:
                log.info("closed %d changelog writers of job %s", closed, self.job_id)
        finally:
            self.coordinator.close()

    @property
    def job_id(self) -> str:
        return self.coordinator.config.job_id

    def await_termination(self, timeout_s: float | None = None) -> bool | None:
        if self.query is None:
            return True
        return self.query.awaitTermination(None if timeout_s is None else int(timeout_s))  # type: ignore[no-any-return]


def source_progress(spark_checkpoint: str | Path, batch_id: int) -> Any:
    """Spark's offsets log entry of the batch (what input the checkpoint covers).

    Read from a local (or ``file://``) checkpoint location only; on any other
    file system (``s3a://``...) it is ``None``: the record goes without it.
    """
    location = str(spark_checkpoint)
    scheme = url_scheme(location)
    if scheme not in ("", "file"):
        return None
    path = Path(urlsplit(location).path if scheme else location) / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    out: list[Any] = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out
