"""The checkpoint timeout: a batch whose checkpoint takes too long is aborted."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dstl_client.core.errors import DstlError

log = logging.getLogger(__name__)


class CheckpointTimedOut(DstlError):
    """A batch's checkpoint took longer than the checkpoint timeout and was aborted."""

    grpc_code = "DEADLINE_EXCEEDED"
    kind = "checkpoint_timed_out"


class CheckpointWatchdog:
    """Aborts the batch in flight once its checkpoint outlives the checkpoint timeout.

    A batch is in flight from :meth:`begin` (its plan) to :meth:`end` (its
    record, or its failure). The timeout is read from ``timeout_s()`` at every
    check, so a new value governs the batch in flight too (extended: it may
    finish; shortened below its elapsed time: it is aborted at the next check).

    Invariants: at most one batch is in flight; a batch is aborted at most
    once, and ``on_timeout(batch_id)`` is called once for it, outside the
    lock; an aborted batch is never recorded (:meth:`raise_if_aborted`).

    Threads: any. The foreachBatch thread begins, ends and checks batches; the
    watchdog's own thread (:meth:`start`) and REST handler threads (a changed
    timeout) call :meth:`check`. State is guarded by an internal lock.
    """

    def __init__(
        self,
        timeout_s: Callable[[], float],
        *,
        on_abort: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._timeout_s = timeout_s
        self._on_abort = on_abort
        self._clock = clock
        self._lock = threading.Lock()
        #: the batch being checkpointed and when it was planned (clock time)
        self._in_flight: tuple[int, float] | None = None
        self._aborted: set[int] = set()
        #: called with the batch id when its checkpoint times out (e.g. cancels its Spark jobs)
        self.on_timeout: Callable[[int], None] | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def begin(self, batch_id: int) -> None:
        with self._lock:
            self._in_flight = (batch_id, self._clock())
            self._aborted.discard(batch_id)

    def end(self, batch_id: int) -> None:
        """The batch is over (recorded, or failed without a record): nothing in flight."""
        with self._lock:
            if self._in_flight is not None and self._in_flight[0] == batch_id:
                self._in_flight = None

    def check(self) -> None:
        """Abort the batch in flight if it outlived the checkpoint timeout."""
        with self._lock:
            if self._in_flight is None:
                return
            batch, started = self._in_flight
            timeout = self._timeout_s()
            if batch in self._aborted or self._clock() - started <= timeout:
                return
            self._aborted.add(batch)
            callback = self.on_timeout
        if self._on_abort is not None:
            self._on_abort()
        log.warning("checkpoint of batch %d exceeded the timeout of %.1fs: aborted", batch, timeout)
        if callback is not None:
            try:
                callback(batch)
            except Exception:
                log.exception("aborting batch %d failed", batch)

    def was_aborted(self, batch_id: int) -> bool:
        """Whether the checkpoint of ``batch_id`` was aborted (and not begun again since)."""
        with self._lock:
            return batch_id in self._aborted

    def raise_if_aborted(self, batch_id: int) -> None:
        """:class:`CheckpointTimedOut` (and nothing in flight) if the batch was aborted."""
        self.check()
        with self._lock:
            if batch_id not in self._aborted:
                return
            if self._in_flight is not None and self._in_flight[0] == batch_id:
                self._in_flight = None
        raise CheckpointTimedOut(
            f"the checkpoint of batch {batch_id} exceeded the timeout of "
            f"{self._timeout_s():.1f}s and was aborted"
        )

    def start(self, period_s: float = 0.2) -> None:
        """Check every ``period_s`` on a daemon thread of its own (until :meth:`close`)."""

        def loop() -> None:
            while not self._closing.wait(period_s):
                self.check()

        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=loop, name="dstl-checkpoint-timeout", daemon=True
                )
                self._thread.start()

    def close(self) -> None:
        self._closing.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(5)
