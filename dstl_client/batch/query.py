"""A running keyed query: the Spark query, its coordinator(s), its statistics."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dstl_client.batch.options import KeyedOptions
from dstl_client.checkpoint.stats import CheckpointStats
from dstl_client.coordinator.config import url_scheme
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.failures import CheckpointFailures
from dstl_client.coordinator.lifecycle import DisposeResult
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.core.errors import DstlError

log = logging.getLogger(__name__)


class QueryStopping(DstlError):
    """Raised into Spark for a batch that starts while :meth:`DstlQuery.stop` runs."""

    kind = "query_stopping"


@dataclass(frozen=True, slots=True)
class TriggerSwitch:
    """One change of the checkpoint interval of a running query; durations in seconds."""

    interval_s: float
    #: waiting for the batch in flight to end
    wait_s: float
    #: Spark's ``StreamingQuery.stop``
    stop_s: float
    #: ``writeStream...start()`` of the query with the new trigger
    start_s: float

    @property
    def total_s(self) -> float:
        return self.wait_s + self.stop_s + self.start_s


def trigger_of(interval_s: float, default: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The ``DataStreamWriter.trigger`` keywords of a checkpoint interval (0: ``default``)."""
    if interval_s > 0:
        return {"processingTime": f"{round(interval_s * 1000)} milliseconds"}
    return default


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
        #: what ``stop(cancel=True)`` disposed of (``retain_on_cancel=False``)
        self.disposed: DisposeResult | None = None
        #: set while the trigger is switched (the Spark query is stopped and started)
        self.pausing = False
        self.switching = threading.Event()
        #: ``restart(interval_s)``: start the Spark query again with that interval
        self.restart: Callable[[float], Any] | None = None
        #: the trigger switches done so far, in order
        self.switches: list[TriggerSwitch] = []
        self._switch_lock = threading.Lock()
        #: the query's consecutive checkpoint failures (set by the batch cycle)
        self.failures: CheckpointFailures | None = None

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
            self.raise_if_stopped()
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} not checkpointed in {timeout_s}s")
            time.sleep(0.1)

    def raise_if_stopped(self) -> None:
        """:class:`RuntimeError` with Spark's error if the query ended (not by a trigger switch)."""
        query = self.query
        if (
            query is not None
            and not query.isActive
            and not self.switching.is_set()
            and self.query is query  # not replaced by a trigger switch meanwhile
        ):
            raise RuntimeError(f"the query stopped: {query.exception()}")

    @property
    def halted(self) -> bool:
        """No batch may start: the query is stopping or switching its trigger."""
        return self.stopping or self.pausing

    def change_interval(self, interval_s: float) -> None:
        """Switch the query's trigger to ``interval_s`` between two batches (in a thread).

        Called by the coordinator when ``checkpointInterval`` changes (see
        :mod:`dstl_client.coordinator.rest`). The batch in flight finishes;
        then the Spark query is stopped and started again from its checkpoint
        with the new trigger, in this driver: the Spark application, its
        executors and their node-local state stay (a batch that would start
        meanwhile fails with :class:`QueryStopping`, uncommitted, and runs in
        the new query). Each switch is recorded in :attr:`switches`.
        """
        if self.restart is None or self.stopping:
            return
        threading.Thread(
            target=self._switch, args=(interval_s,), name="dstl-trigger-switch", daemon=True
        ).start()

    def _switch(self, interval_s: float, timeout_s: float = 120.0) -> None:
        restart = self.restart
        assert restart is not None
        with self._switch_lock:
            if self.stopping:
                return
            t0 = time.monotonic()
            self.switching.set()
            self.pausing = True
            try:
                if self.in_batch.acquire(timeout=timeout_s):  # the batch in flight ends first
                    self.in_batch.release()
                t1 = time.monotonic()
                query = self.query
                if query is not None and not self._stop_within(query, timeout_s):
                    log.error(
                        "job %s: the Spark query did not stop in %.0fs; trigger not switched",
                        self.job_id,
                        timeout_s,
                    )
                    return
                t2 = time.monotonic()
                self.pausing = False
                if not self.stopping:
                    self.query = restart(interval_s)
                t3 = time.monotonic()
            except Exception:
                log.exception("switching the trigger of job %s failed", self.job_id)
                raise
            finally:
                self.pausing = False
                self.switching.clear()
            switch = TriggerSwitch(interval_s, t1 - t0, t2 - t1, t3 - t2)
            self.switches.append(switch)
            log.info(
                "job %s: checkpoint interval now %.3fs (trigger switched in %.2fs: waited %.2fs "
                "for the batch in flight, stopped in %.2fs, started in %.2fs)",
                self.job_id,
                interval_s,
                switch.total_s,
                switch.wait_s,
                switch.stop_s,
                switch.start_s,
            )

    @staticmethod
    def _stop_within(query: Any, timeout_s: float) -> bool:
        """``query.stop()`` unless it already ended; whether it ended within ``timeout_s``."""
        if not query.isActive:  # e.g. a batch refused while pausing already ended it
            return True
        done = threading.Event()

        def stop() -> None:
            try:
                query.stop()
            finally:
                done.set()

        threading.Thread(target=stop, name="dstl-query-stop", daemon=True).start()
        return done.wait(timeout_s)

    def stop(self, timeout_s: float = 120.0, *, cancel: bool = False) -> None:
        """Stop the query between two batches, close its writers, release the coordinator.

        ``cancel=True`` ends the job for good: with ``retain_on_cancel=False``
        (Flink's DELETE_ON_CANCELLATION) its checkpoints are disposed of once
        Spark stopped (records, the objects only they use, the local Spark
        checkpoint: :func:`~dstl_client.coordinator.lifecycle.dispose_operator`);
        with the default ``retain_on_cancel=True`` (RETAIN_ON_CANCELLATION) they
        stay, for a later start or ``dstl checkpoints restore``.

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
            if cancel and not self.coordinator.config.retain_on_cancel:
                self.disposed = self.coordinator.dispose()
                log.info(
                    "job %s cancelled: checkpoints disposed of (%s)", self.job_id, self.disposed
                )
        finally:
            self.coordinator.close()

    @property
    def job_id(self) -> str:
        return self.coordinator.config.job_id

    def await_termination(self, timeout_s: float | None = None) -> bool | None:
        if self.query is None:
            return True
        return self.query.awaitTermination(None if timeout_s is None else int(timeout_s))  # type: ignore[no-any-return]


class ChainQuery(DstlQuery):
    """A running chain: one Spark query, one coordinator per stage.

    ``coordinator`` is the first stage's, which records last: a batch is
    checkpointed in the whole chain once it has its record (``wait_for_batch``).
    Threads as :class:`DstlQuery`.
    """

    def __init__(self, coordinators: list[CheckpointCoordinator], metrics_port: int | None) -> None:
        super().__init__(coordinators[0], metrics_port)
        self.coordinators = coordinators

    def stop(self, timeout_s: float = 120.0, *, cancel: bool = False) -> None:
        """Stop the query between two batches (see :meth:`DstlQuery.stop`), then every stage.

        ``cancel=True`` with ``retain_on_cancel=False`` disposes of every
        stage's checkpoints (its records and the objects only they use).
        """
        try:
            super().stop(timeout_s, cancel=cancel)  # the first stage's writers and coordinator
        finally:
            for coordinator in self.coordinators[1:]:
                try:
                    coordinator.close_writers()
                    if cancel and not coordinator.config.retain_on_cancel:
                        coordinator.dispose()
                finally:
                    coordinator.close()


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


def start_query(
    df: Any, run_batch: Callable[[Any, int], None], opts: KeyedOptions, interval_s: float = 0.0
) -> Any:
    """Start ``df.writeStream.foreachBatch(run_batch)`` with the query options of ``opts``.

    ``interval_s`` > 0 (the effective checkpoint interval, e.g. a REST
    override) is the trigger; else ``opts.trigger``.
    """
    writer = df.writeStream.foreachBatch(run_batch).option(
        "checkpointLocation", str(opts.spark_checkpoint_dir)
    )
    trigger = trigger_of(interval_s, opts.trigger)
    if trigger:
        writer = writer.trigger(**trigger)
    if opts.query_name:
        writer = writer.queryName(opts.query_name)
    return writer.start()
