"""The Spark jobs of a query's batch in flight, tagged so that its abort cancels them.

When a batch's checkpoint outlives the checkpoint timeout, the coordinator's
watchdog aborts it (:class:`~dstl_client.coordinator.watchdog.CheckpointWatchdog`),
and its running Spark jobs must end then, not when their tasks do: the batch
is run again at once (a tolerated failure), and its tasks hold the executors'
cores meanwhile.

The jobs a batch starts on its thread carry a SparkContext job tag
(``SparkContext.addJobTag``, a property of the thread that starts them) and
are cancelled with ``SparkContext.cancelJobsWithTag``, with the thread's
``spark.job.interruptOnCancel`` on: a cancelled job fails at once (the
batch's ``collect`` raises), and its tasks' threads are interrupted, so their
Python workers stop (Spark destroys one that does not within
``spark.python.task.killTimeout``). The session's tags
(``SparkSession.addTag`` and ``interruptTag``) do not do this in classic
PySpark 4: ``interruptTag`` finds no job of a ``foreachBatch`` function, and
its tasks run to their end.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

#: the thread's local property saying whether cancelling its jobs interrupts their tasks
INTERRUPT_ON_CANCEL = "spark.job.interruptOnCancel"


class BatchJobs:
    """The Spark jobs of one query's batches in flight, by batch id: cancellable.

    Invariants: a batch's jobs carry its tag (``dstl-<job id>-<query>-<batch
    id>``, ``<query>`` drawn for this object, so no other query's jobs carry
    it) only while :meth:`running` is open on the thread that starts them;
    on leaving, that thread's tags and ``spark.job.interruptOnCancel`` are as
    before; :meth:`cancel` cancels the
    jobs of a batch in flight only (of no other batch, of no other query).

    Threads: :meth:`running` on the thread that runs the batch (Spark's
    ``foreachBatch`` thread); :meth:`cancel` on any (the watchdog's). The
    table of batches in flight is guarded by a lock.
    """

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        #: the tags' prefix: this query's
        self.prefix = f"dstl-{job_id}-{uuid.uuid4().hex[:8]}-"
        self._lock = threading.Lock()
        #: batch id -> (its SparkContext, its tag)
        self._running: dict[int, tuple[Any, str]] = {}

    @contextlib.contextmanager
    def running(self, spark_context: Any, batch_id: int) -> Iterator[None]:
        """Tag the Spark jobs this thread starts inside for ``batch_id``, cancelled by
        :meth:`cancel` with their tasks interrupted."""
        tag = f"{self.prefix}{batch_id}"
        interrupt = spark_context.getLocalProperty(INTERRUPT_ON_CANCEL)
        spark_context.addJobTag(tag)
        spark_context.setInterruptOnCancel(True)
        with self._lock:
            self._running[batch_id] = (spark_context, tag)
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(batch_id, None)
            spark_context.removeJobTag(tag)
            spark_context.setLocalProperty(INTERRUPT_ON_CANCEL, interrupt)

    def cancel(self, batch_id: int) -> bool:
        """Cancel the running Spark jobs of ``batch_id``; whether it was in flight."""
        with self._lock:
            found = self._running.get(batch_id)
        if found is None:
            return False
        spark_context, tag = found
        spark_context.cancelJobsWithTag(tag)
        return True
