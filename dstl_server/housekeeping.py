"""Store housekeeping: gRPC health follows the blob store; leftovers of crashes go away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dstl_client.core.errors import StorageError
from dstl_server.metrics import ServerMetrics
from dstl_server.storage.base import BlobStore

log = logging.getLogger(__name__)

#: default seconds between two store probes
PROBE_INTERVAL_S = 5.0
#: default number of probe rounds between two periodic leftover sweeps
SWEEP_EVERY = 12


class StoreHousekeeping:
    """Probes the store, reports its health, removes leftovers of interrupted writes.

    Runs as one asyncio task on the server's event loop; ``start``, ``stop``
    and the ``on_health`` callback all run on that loop (not thread-safe).

    Invariants:

    * ``start`` probes the store once before it returns and calls
      ``on_health`` with the result, so a server that reports READY after
      ``start`` never claims SERVING for a store that did not answer. After
      that ``on_health`` is called only when the state changes (up to down or
      down to up); a callback that raised is called again next round.
    * The store is up iff its latest probe returned within
      ``probe_timeout_s``; ``up``, ``last_error`` and the ``dstl_store_up``
      gauge show that state, ``dstl_store_probe_failures_total`` counts failed
      probes. A store that stops answering is logged once (the failure of
      the start probe is left to the caller: ``last_error``).
    * The start sweep (``sweep_leftovers(0)``: every temp file, they all
      belong to an earlier process) runs once, with the first probe that
      succeeds. After it, every ``sweep_every``-th round that finds the store
      up sweeps temp files older than ``leftover_age_s``; with that at least
      the upload deadline, a write in progress is never touched. Sweeps never
      run while the store is down.
    * Every step is bounded: a probe by ``probe_timeout_s`` (a probe that
      hangs counts as down), a sweep by ``sweep_timeout_s``. Errors of probes,
      sweeps and the callback are logged and never end the loop; only ``stop`` (cancellation) does. ``stop`` cancels the task and
      waits for it; it is idempotent, and a stopped instance cannot restart.
    """

    def __init__(
        self,
        store: BlobStore,
        *,
        on_health: Callable[[bool], Awaitable[None]],
        metrics: ServerMetrics | None = None,
        probe_interval_s: float = PROBE_INTERVAL_S,
        leftover_age_s: float = 300.0,
        sweep_every: int = SWEEP_EVERY,
        probe_timeout_s: float = 5.0,
        sweep_timeout_s: float = 120.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``sleep`` waits between rounds (tests inject one that they drive)."""
        if not (probe_interval_s > 0 and probe_timeout_s > 0 and sweep_timeout_s > 0):
            raise ValueError("probe_interval_s, probe_timeout_s and sweep_timeout_s must be > 0")
        if leftover_age_s < 0 or sweep_every < 1:
            raise ValueError("leftover_age_s must be >= 0 and sweep_every >= 1")
        self.store = store
        self.on_health = on_health
        self.metrics = metrics
        self.probe_interval_s = probe_interval_s
        self.leftover_age_s = leftover_age_s
        self.sweep_every = sweep_every
        self.probe_timeout_s = probe_timeout_s
        self.sweep_timeout_s = sweep_timeout_s
        self._sleep = sleep
        #: the result of the latest probe (None before the first)
        self.up: bool | None = None
        #: why the latest probe failed (None while the store is up)
        self.last_error: StorageError | None = None
        #: the background task between ``start`` and ``stop``
        self.task: asyncio.Task[None] | None = None
        self._reported: bool | None = None  # last state on_health took without raising
        self._start_sweep_done = False
        self._started = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Probe (and sweep) once now, report the health, then go on in the background."""
        if self._started:
            raise RuntimeError("StoreHousekeeping can be started once")
        self._started = True
        await self._round(sweep=False)
        self.task = asyncio.create_task(self._run(), name="dstl-store-housekeeping")

    async def stop(self) -> None:
        """Cancel the background task and wait for it (idempotent)."""
        task, self.task = self.task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # stop() itself was cancelled

    async def _run(self) -> None:
        rounds = 0
        while True:
            await self._sleep(self.probe_interval_s)
            rounds += 1
            await self._round(sweep=rounds % self.sweep_every == 0)

    # --------------------------------------------------------------- rounds
    async def _round(self, *, sweep: bool) -> None:
        up = await self._probe()
        if up:
            if not self._start_sweep_done:
                self._start_sweep_done = await self._sweep(0.0)
            elif sweep:
                await self._sweep(self.leftover_age_s)
        await self._report(up)

    async def _probe(self) -> bool:
        try:
            await asyncio.wait_for(self.store.probe(), self.probe_timeout_s)
        except TimeoutError:
            error = StorageError(
                f"store {self.store.url} did not answer within {self.probe_timeout_s:g}s",
                retryable=True,
            )
        except StorageError as exc:
            error = exc
        except Exception as exc:  # a bug in a store must not end health reporting
            error = StorageError(f"probe of {self.store.url}: {exc!r}", retryable=False)
        else:
            if self.up is False:
                log.warning("store %s answers again", self.store.url)
            self.up, self.last_error = True, None
            if self.metrics is not None:
                self.metrics.store_up.set(1)
            return True
        # The start probe's failure is the caller's to report (the sidecar either
        # exits on it or logs it in its "serving" line); later ones are logged here.
        if self.up is True:
            log.warning("store %s does not answer: %s", self.store.url, error.message)
        self.up, self.last_error = False, error
        if self.metrics is not None:
            self.metrics.store_up.set(0)
            self.metrics.store_probe_failures.inc()
        return False

    async def _sweep(self, older_than_s: float) -> bool:
        """One sweep; False when it failed (logged)."""
        try:
            removed = await asyncio.wait_for(
                self.store.sweep_leftovers(older_than_s), self.sweep_timeout_s
            )
        except TimeoutError:
            log.warning(
                "sweep of leftover temp files in %s did not finish within %gs",
                self.store.url,
                self.sweep_timeout_s,
            )
            return False
        except Exception as exc:
            message = exc.message if isinstance(exc, StorageError) else repr(exc)
            log.warning("sweep of leftover temp files in %s failed: %s", self.store.url, message)
            return False
        if removed:
            if self.metrics is not None:
                self.metrics.leftover_temp_files_removed.inc(removed)
            log.warning(
                "removed %d leftover temp file(s) of interrupted writes from %s%s",
                removed,
                self.store.url,
                " (left by an earlier process)" if older_than_s <= 0 else "",
            )
        return True

    async def _report(self, up: bool) -> None:
        if up == self._reported:
            return
        self._reported = None  # unknown until the callback returns
        try:
            await self.on_health(up)
        except Exception:
            log.exception("reporting store health (%s) failed", "up" if up else "down")
            return
        self._reported = up
