"""Prometheus metrics of the checkpoint coordinator (the driver side).

Each coordinator has its own registry, so several jobs (or tests) in one
process do not collide. :meth:`CoordinatorMetrics.serve` exposes it over
HTTP on its own port.

Every name starts with ``dstl_driver_`` and every metric carries the label
``job_id`` (never ``job``: Prometheus reserves it for the scrape job), so no
name means one thing on a sidecar (``dstl_*``, :mod:`dstl_server.metrics`)
and another on the driver. The registry also carries prometheus-client's
process (``process_*``) and Python (``python_*``) collectors.
``docs/observability.md`` lists them all.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from dstl_client.checkpoint.stats import CheckpointStats
from dstl_client.core.version import package_version

if TYPE_CHECKING:
    from dstl_client.coordinator.batches import MatRound
    from dstl_client.coordinator.config import CheckpointSettings

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_BYTES = tuple(float(4**i * 1024) for i in range(12))
#: the one label of every driver metric
LABELS = ("job_id",)


class CoordinatorMetrics:
    """Checkpoint, materialization, recovery and cleanup figures of one job.

    Thread: any (prometheus-client's metrics are thread-safe; the HTTP
    server runs on its own thread).
    """

    def __init__(self, job_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = LABELS
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.build_info = Info(
            "dstl_driver_build", "Version of dstl and of Python of this driver", labels, registry=r
        )
        self.build_info.labels(job_id).info(
            {"version": package_version(), "python": platform.python_version()}
        )

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(job_id)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(job_id)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(job_id)

        self.batch_duration = hist(
            "dstl_driver_batch_duration_seconds",
            "Wall time of a micro-batch, tasks and record.",
            _SECONDS,
        )
        self.checkpoint_duration = hist(
            "dstl_driver_checkpoint_duration_seconds",
            "Slowest task's persist plus writing the checkpoint record.",
            _SECONDS,
        )
        self.checkpoint_bytes = hist(
            "dstl_driver_checkpoint_persisted_bytes",
            "Changelog bytes persisted per checkpoint.",
            _BYTES,
        )
        self.materialization_duration = hist(
            "dstl_driver_materialization_duration_seconds",
            "Slowest subtask's upload in a materialization round.",
            _SECONDS,
        )
        self.materialization_bytes = hist(
            "dstl_driver_materialization_bytes",
            "Snapshot bytes uploaded per materialization round.",
            _BYTES,
        )
        self.checkpoints = counter("dstl_driver_checkpoints", "Checkpoints recorded.")
        self.skipped_batches = counter(
            "dstl_driver_skipped_batches",
            "Re-run batches skipped because their checkpoint existed.",
        )
        self.materializations = counter(
            "dstl_driver_materializations", "Materializations recorded."
        )
        self.materialization_failures = counter(
            "dstl_driver_materialization_failures", "Materialization rounds that failed."
        )
        self.checkpoint_timeouts = counter(
            "dstl_driver_checkpoint_timeouts", "Checkpoints aborted by the checkpoint timeout."
        )
        self.restores = counter("dstl_driver_restores", "Subtasks that restored from a checkpoint.")
        self.discarded_objects = counter(
            "dstl_driver_discarded_objects", "Objects discarded (unreferenced or orphaned)."
        )
        self.orphans = counter("dstl_driver_orphan_objects", "Orphaned objects removed on start.")
        self.last_batch = gauge(
            "dstl_driver_last_checkpoint_batch", "Batch id of the last checkpoint."
        )
        self.state_bytes = gauge("dstl_driver_state_bytes", "Local state size over all subtasks.")
        self.checkpoint_size = gauge(
            "dstl_driver_checkpoint_size_bytes",
            "Bytes the last checkpoint refers to (parts + changelog).",
        )
        self.segments = gauge(
            "dstl_driver_changelog_segments", "Changelog handles in the last record."
        )
        self.rows = counter("dstl_driver_rows", "Input rows processed.")
        self.last_materialization = gauge(
            "dstl_driver_last_materialization_timestamp_seconds",
            "Unix time of the last completed materialization (before the first: of the start).",
        )
        self.last_materialization.set(time.time())
        self.checkpoint_timeout = gauge(
            "dstl_driver_checkpoint_timeout_seconds",
            "Checkpoint timeout in force (checkpoint_timeout_s).",
        )
        self.materialize_interval = gauge(
            "dstl_driver_materialize_interval_seconds",
            "Materialization interval in force (materialize_interval_s).",
        )
        self.metadata_retries = _RetriesCollector(job_id)
        r.register(self.metadata_retries)
        self._server: Any = None
        self._lock = threading.Lock()

    def watch(
        self, settings: Callable[[], CheckpointSettings], metadata_retries: Callable[[], int]
    ) -> None:
        """Export what is read at each scrape: the timeout and interval in force
        (``settings()``) and the metadata store's retries (``metadata_retries()``, as
        ``dstl_driver_metadata_retries_total``: the store counts, the metric reads)."""
        self.checkpoint_timeout.set_function(lambda: settings().checkpoint_timeout_s)
        self.materialize_interval.set_function(lambda: settings().materialize_interval_s)
        self.metadata_retries.read = metadata_retries

    def observe_checkpoint(
        self,
        stats: CheckpointStats,
        materialization: bool | None,
        mat_round: MatRound | None = None,
    ) -> None:
        """A recorded checkpoint; ``materialization``: None unless a round ended with it, else
        whether it completed (``mat_round``: that round's figures)."""
        self.checkpoints.inc()
        self.last_batch.set(stats.batch_id)
        self.checkpoint_duration.observe(stats.checkpoint_s)
        self.checkpoint_bytes.observe(stats.persisted_bytes)
        self.state_bytes.set(stats.state_bytes)
        self.checkpoint_size.set(stats.checkpoint_size_bytes)
        self.segments.set(stats.segments)
        self.rows.inc(stats.rows)
        self.restores.inc(stats.restored_subtasks)
        self.discarded_objects.inc(stats.discarded_objects)
        if stats.batch_s is not None:
            self.batch_duration.observe(stats.batch_s)
        if materialization is True:
            self.materializations.inc()
            self.last_materialization.set(time.time())
            r = mat_round
            self.materialization_duration.observe(stats.mat_max_s if r is None else r.max_s)
            self.materialization_bytes.observe(stats.mat_bytes if r is None else r.bytes)
        elif materialization is False:
            self.materialization_failures.inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Expose ``/metrics`` on ``host:port`` (0 = any free port); returns the port."""
        with self._lock:
            if self._server is None:
                server, _thread = start_http_server(port, addr=host, registry=self.registry)
                self._server = server
            return int(self._server.server_port)

    def close(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()
                self._server = None


class _RetriesCollector(Collector):
    """``dstl_driver_metadata_retries_total``, read from the store at each scrape (the
    store owns the count, a counter of its own would be a second one)."""

    NAME = "dstl_driver_metadata_retries"
    DOC = "Attempts the job's metadata store repeated after a transient failure."

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.read: Callable[[], int] = lambda: 0
        #: its row of the generated metrics table (name, type, labels, meaning)
        self.documented = (f"{self.NAME}_total", "counter", ", ".join(LABELS), self.DOC)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.NAME, self.DOC, labels=LABELS)
        family.add_metric([self.job_id], self.read())
        yield family
