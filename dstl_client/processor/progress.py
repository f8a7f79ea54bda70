"""A running processor query, with its per-batch figures in Spark's query progress.

:class:`ProcessorQuery` is a :class:`~dstl_client.batch.query.DstlQuery`
that keeps one :class:`~.stats.BatchFigures` per batch (checkpoint duration,
bytes persisted, state rows and bytes, timers fired, TTL evictions, late rows
dropped, watermark). ``lastProgress`` and ``recentProgress`` are Spark's
progress dictionaries with those figures under ``"dstl"``; a
``StreamingQueryListener`` logs each progress with them on the driver.

Threads: the batch thread records figures, Spark's listener thread and the
user's thread read them (under a lock).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from dstl_client.batch.query import DstlQuery
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.processor.stats import BatchFigures

log = logging.getLogger(__name__)

#: figures of this many recent batches are kept
KEEP_FIGURES = 100


class ProcessorQuery(DstlQuery):
    """A :class:`DstlQuery` whose progress carries the processor's figures (key ``"dstl"``)."""

    def __init__(self, coordinator: CheckpointCoordinator, metrics_port: int | None) -> None:
        super().__init__(coordinator, metrics_port)
        self._figures: dict[int, BatchFigures] = {}
        self._lock = threading.Lock()
        self._listener: Any = None
        self._session: Any = None

    # ------------------------------------------------------------ figures
    def record(self, figures: BatchFigures) -> None:
        """The batch thread: one batch's figures (logged)."""
        with self._lock:
            self._figures[figures.batch_id] = figures
            for old in sorted(self._figures)[:-KEEP_FIGURES]:
                del self._figures[old]
        log.info("%s", figures.describe())

    def figures(self, batch_id: int) -> BatchFigures | None:
        with self._lock:
            return self._figures.get(batch_id)

    @property
    def batch_figures(self) -> list[BatchFigures]:
        """The figures of the recent batches, oldest first."""
        with self._lock:
            return [self._figures[b] for b in sorted(self._figures)]

    def with_figures(self, progress: dict[str, Any] | None) -> dict[str, Any] | None:
        """Spark's progress of a batch with that batch's figures under ``"dstl"``."""
        if progress is None:
            return None
        found = self.figures(int(progress.get("batchId", -1)))
        return {**progress, "dstl": None if found is None else found.to_json()}

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return None if self.query is None else self.with_figures(self.query.lastProgress)

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        if self.query is None:
            return []
        return [p for p in map(self.with_figures, self.query.recentProgress) if p is not None]

    # ----------------------------------------------------------- listener
    def listen(self, session: Any) -> None:
        """Log every progress of this query with its figures (a ``StreamingQueryListener``)."""
        self._listener = progress_listener(self)
        self._session = session
        session.streams.addListener(self._listener)

    def unlisten(self) -> None:
        """Remove the progress listener (once; the session may be gone already)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                self._session.streams.removeListener(listener)
            except Exception as exc:
                log.debug("removing the progress listener: %s", exc)

    def stop(self, timeout_s: float = 120.0, *, cancel: bool = False) -> None:
        try:
            super().stop(timeout_s, cancel=cancel)
        finally:
            self.unlisten()


def progress_listener(query: ProcessorQuery) -> Any:
    """A ``StreamingQueryListener`` that logs ``query``'s progress with its figures."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class _ProgressListener(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            if query.query is None or str(progress.id) != str(query.query.id):
                return
            merged = query.with_figures(json.loads(progress.json))
            if merged is not None:
                log.info(
                    "query %s batch %s: %d input rows in %s ms; dstl %s",
                    progress.name or progress.id,
                    progress.batchId,
                    progress.numInputRows,
                    (progress.durationMs or {}).get("triggerExecution"),
                    json.dumps(merged["dstl"], separators=(",", ":")),
                )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return _ProgressListener()
