"""Prometheus metrics of the checkpoint coordinator (the driver side).

Each coordinator has its own registry, so several jobs (or tests) in one
process do not collide. :meth:`CoordinatorMetrics.serve` exposes it over
HTTP on its own port.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dstl_client.coordinator.stats import CheckpointStats

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BYTES = tuple(float(4**i * 1024) for i in range(12))


class CoordinatorMetrics:
    """Checkpoint, materialization, recovery and cleanup figures of one job.

    Thread: any (prometheus-client's metrics are thread-safe; the HTTP
    server runs on its own thread).
    """

    def __init__(self, job_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["job"]
        r = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(job_id)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(job_id)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(job_id)

        self.batch_duration = hist(
            "dstl_batch_duration_seconds", "Wall time of a micro-batch, tasks and record.", _SECONDS
        )
        self.checkpoint_duration = hist(
            "dstl_checkpoint_duration_seconds",
            "Slowest task's persist plus writing the checkpoint record.",
            _SECONDS,
        )
        self.checkpoint_bytes = hist(
            "dstl_checkpoint_persisted_bytes", "Changelog bytes persisted per checkpoint.", _BYTES
        )
        self.materialization_duration = hist(
            "dstl_materialization_duration_seconds",
            "Slowest task's materialization in a batch.",
            _SECONDS,
        )
        self.materialization_bytes = hist(
            "dstl_materialization_bytes", "Snapshot bytes uploaded per materialization.", _BYTES
        )
        self.checkpoints = counter("dstl_checkpoints", "Checkpoints recorded.")
        self.skipped_batches = counter(
            "dstl_skipped_batches", "Re-run batches skipped because their checkpoint existed."
        )
        self.materializations = counter("dstl_materializations", "Materializations recorded.")
        self.materialization_failures = counter(
            "dstl_materialization_failures", "Batches whose materialization failed."
        )
        self.checkpoint_timeouts = counter(
            "dstl_checkpoint_timeouts", "Checkpoints aborted by the checkpoint timeout."
        )
        self.restores = counter("dstl_restores", "Subtasks that restored from a checkpoint.")
        self.discarded_objects = counter(
            "dstl_discarded_objects", "Objects discarded (unreferenced or orphaned)."
        )
        self.orphans = counter("dstl_orphan_objects", "Orphaned objects removed on start.")
        self.last_batch = gauge("dstl_last_checkpoint_batch", "Batch id of the last checkpoint.")
        self.state_bytes = gauge("dstl_state_bytes", "Local state size over all subtasks.")
        self.checkpoint_size = gauge(
            "dstl_checkpoint_size_bytes", "Bytes the last checkpoint refers to (parts + changelog)."
        )
        self.segments = gauge("dstl_changelog_segments", "Changelog handles in the last record.")
        self.rows = counter("dstl_rows", "Input rows processed.")
        self._server: Any = None
        self._lock = threading.Lock()

    def observe_checkpoint(self, stats: CheckpointStats, materialization: bool | None) -> None:
        """A recorded checkpoint; ``materialization``: None if none was planned, else success."""
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
            self.materialization_duration.observe(stats.mat_max_s)
            self.materialization_bytes.observe(stats.mat_bytes)
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
