"""Prometheus metrics of one sidecar.

Each :class:`ServerMetrics` owns its own registry, so several servers can run
in one process (tests) without clashing. Metrics are updated from the event
loop thread and from upload threads; prometheus-client's types are thread-safe.

Besides the ``dstl_*`` metrics below, the registry carries prometheus-client's
process (``process_*``: CPU, memory, file descriptors) and Python
(``python_info``, ``python_gc_*``) collectors, as its default registry would.
The driver's metrics are ``dstl_driver_*``
(:mod:`dstl_client.coordinator.metrics`): no name is exported by both with
different meanings, and no label is called ``job`` (Prometheus reserves it for
the scrape job; ``job_id`` it is). ``docs/observability.md`` lists them all.
"""

from __future__ import annotations

import platform

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from dstl_client.core.version import package_version

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)
_SIZE_BUCKETS = tuple(float(1 << n) for n in range(10, 31, 2))  # 1 KiB .. 1 GiB
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: gRPC call durations: unary calls (ms) up to streams that live for hours
_GRPC_BUCKETS = (*_LATENCY_BUCKETS, 60.0, 300.0, 1800.0, 3600.0)


def size_class(nbytes: int) -> str:
    """Coarse size label for latency histograms (keeps label cardinality tiny)."""
    if nbytes < 256 * 1024:
        return "lt256k"
    if nbytes < 4 * 1024 * 1024:
        return "lt4m"
    if nbytes < 32 * 1024 * 1024:
        return "lt32m"
    return "ge32m"


class ServerMetrics:
    """All counters, gauges and histograms of the sidecar."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # what the default registry has: the process's and the interpreter's figures
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.build_info = Info(
            "dstl_build", "Version of dstl and of Python of this dstl-server", registry=r
        )
        self.build_info.info({"version": package_version(), "python": platform.python_version()})
        # per gRPC method (dstl_server/grpc_metrics.py); a stream counts once, for its lifetime
        self.grpc_requests = Counter(
            "dstl_grpc_requests",
            "gRPC calls finished, by full method name and status code (a stream counts once)",
            ["method", "code"],
            registry=r,
        )
        self.grpc_request_seconds = Histogram(
            "dstl_grpc_request_seconds",
            "Duration of gRPC calls by method (of a stream: from its start to its end)",
            ["method"],
            buckets=_GRPC_BUCKETS,
            registry=r,
        )
        self.grpc_in_flight = Gauge(
            "dstl_grpc_requests_in_flight",
            "gRPC calls (and open streams) running, by method",
            ["method"],
            registry=r,
        )
        self.writers = Gauge("dstl_writers", "Registered writers", registry=r)
        self.appended_bytes = Counter(
            "dstl_appended_bytes", "Bytes of changes appended", registry=r
        )
        self.appended_changes = Counter("dstl_appended_changes", "Changes appended", registry=r)
        self.append_requests = Counter("dstl_append_requests", "Append RPCs (batches)", registry=r)
        self.persist_requests = Counter(
            "dstl_persist_requests", "persist_durably calls", registry=r
        )
        self.persist_latency = Histogram(
            "dstl_persist_latency_seconds",
            "Time from a persist request to its handle",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.persist_failures = Counter(
            "dstl_persist_failures", "persist_durably calls that failed", registry=r
        )
        self.uploads = Counter("dstl_uploads", "Objects uploaded", ["result"], registry=r)
        self.upload_bytes = Counter("dstl_upload_bytes", "Bytes of objects uploaded", registry=r)
        self.upload_latency = Histogram(
            "dstl_upload_latency_seconds",
            "Upload latency of one object, all attempts included",
            ["size_class"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upload_size = Histogram(
            "dstl_upload_size_bytes", "Size of uploaded objects", buckets=_SIZE_BUCKETS, registry=r
        )
        self.logs_per_object = Histogram(
            "dstl_upload_logs_per_object",
            "Log sections (writers) per uploaded object",
            buckets=_COUNT_BUCKETS,
            registry=r,
        )
        self.upload_attempts = Histogram(
            "dstl_upload_attempts",
            "Attempts started per upload (first, retries and hedges)",
            buckets=(1, 2, 3, 4, 5, 8),
            registry=r,
        )
        self.upload_retries = Counter(
            "dstl_upload_retries", "Upload attempts started after a failure", registry=r
        )
        self.hedges_started = Counter(
            "dstl_hedges_started",
            "Hedged attempts started (upload slower than the hedge delay)",
            registry=r,
        )
        self.hedges_won = Counter(
            "dstl_hedges_won", "Uploads whose winning attempt was a hedge", registry=r
        )
        self.hedge_delay = Gauge("dstl_hedge_delay_seconds", "Hedge delay in force", registry=r)
        self.hedges_skipped_budget = Counter(
            "dstl_hedges_skipped_budget",
            "Hedges not started because the hedge budget was spent",
            registry=r,
        )
        self.upload_failures = Counter(
            "dstl_upload_failures",
            "Uploads that failed for good, by kind of the last error ('deadline' for the deadline)",
            ["kind"],
            registry=r,
        )
        self.upload_deadline_exceeded = Counter(
            "dstl_upload_deadline_exceeded",
            "Uploads that failed because their total deadline passed",
            registry=r,
        )
        self.attempts_discarded = Counter(
            "dstl_upload_attempts_discarded",
            "Objects of losing or failed upload attempts deleted",
            registry=r,
        )
        self.discard_failures = Counter(
            "dstl_upload_discard_failures",
            "Losing attempts whose object could not be deleted (left to the cleaner)",
            registry=r,
        )
        self.preemptive_uploads = Counter(
            "dstl_preemptive_uploads",
            "Writer uploads started before any persist asked",
            registry=r,
        )
        self.flushes = Counter(
            "dstl_flushes", "Batches flushed into one object, by trigger", ["trigger"], registry=r
        )
        self.unuploaded_bytes = Gauge(
            "dstl_unuploaded_bytes", "Bytes appended and not yet uploaded (bounded)", registry=r
        )
        self.in_flight_bytes = Gauge(
            "dstl_upload_in_flight_bytes", "Bytes of objects being uploaded", registry=r
        )
        self.backpressure_waits = Counter(
            "dstl_backpressure_waits", "Appends that had to wait for memory", registry=r
        )
        self.writer_quota_refusals = Counter(
            "dstl_writer_quota_refusals",
            "CreateWriter calls refused by a writer quota (scope: node or job)",
            ["scope"],
            registry=r,
        )
        self.writers_expired = Counter(
            "dstl_writers_expired",
            "Writers closed after writer_idle_timeout_s without a call",
            registry=r,
        )
        self.auth_refusals = Counter(
            "dstl_auth_refusals",
            "Calls refused by authentication (unauthenticated) or job isolation "
            "(permission_denied)",
            ["reason"],
            registry=r,
        )
        self.auth_previous_secret_uses = Counter(
            "dstl_auth_previous_secret_uses",
            "Calls authenticated with a token of the previous auth secret (a rotation is "
            "done when it stops growing)",
            registry=r,
        )
        self.persists_abandoned = Counter(
            "dstl_persists_abandoned",
            "Persist calls cut off because shutdown ran out of grace before their upload ended",
            registry=r,
        )
        self.parked_bytes = Gauge(
            "dstl_parked_bytes",
            "Bytes of change-carrying calls waiting for an earlier call of their writer",
            registry=r,
        )
        self.sessions_failed = Counter(
            "dstl_sessions_failed",
            "Writer sessions failed because a call carrying changes was refused",
            registry=r,
        )
        self.stream_messages = Counter(
            "dstl_stream_messages",
            "Messages of writer streams (Session, Mux) by direction (in: requests, out: answers)",
            ["direction"],
            registry=r,
        )
        self.stream_requests_per_message = Histogram(
            "dstl_stream_requests_per_message",
            "Writer requests (in) or answers (out) one Mux stream message carries",
            ["direction"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024),
            registry=r,
        )
        self.stream_persists_per_message = Histogram(
            "dstl_stream_persists_per_message",
            "Persist answers one Mux answer message carries (messages with at least one)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024),
            registry=r,
        )
        self.reads = Counter("dstl_read_requests", "ReadChanges calls", registry=r)
        self.read_bytes = Counter("dstl_read_bytes", "Bytes of objects read", registry=r)
        self.read_cache_hits = Counter(
            "dstl_read_cache_hits", "Object reads served from the read cache", registry=r
        )
        self.read_cache_misses = Counter(
            "dstl_read_cache_misses", "Object reads that went to the store", registry=r
        )
        self.read_cache_bytes = Gauge(
            "dstl_read_cache_bytes", "Bytes of object bodies in the read cache", registry=r
        )
        self.list_requests = Counter(
            "dstl_list_requests", "ListObjects calls (pages of a job's object listing)", registry=r
        )
        self.discarded_objects = Counter(
            "dstl_discarded_objects", "Objects deleted by DiscardObjects or cleanup", registry=r
        )
        self.errors = Counter(
            "dstl_errors", "Errors returned to callers, by kind", ["kind"], registry=r
        )
        self.storage_failures = Counter(
            "dstl_storage_failures",
            "Failed store operations, by operation and kind",
            ["op", "kind"],
            registry=r,
        )
        self.store_up = Gauge(
            "dstl_store_up",
            "1 while the blob store answers probes, 0 while it does not (health NOT_SERVING)",
            registry=r,
        )
        self.store_probe_failures = Counter(
            "dstl_store_probe_failures", "Store probes that failed or timed out", registry=r
        )
        self.leftover_temp_files_removed = Counter(
            "dstl_leftover_temp_files_removed",
            "Temp files of interrupted writes removed from the store (at start and by sweeps)",
            registry=r,
        )
        # forwarding tree (see dstl_server/forwarder.py)
        self.forwarded_batches = Counter(
            "dstl_forwarded_batches",
            "Flushes this node forwarded to its parent and the parent placed in an object",
            registry=r,
        )
        self.forwarded_bytes = Counter(
            "dstl_forwarded_bytes", "Bytes of log sections forwarded to the parent", registry=r
        )
        self.forward_received_batches = Counter(
            "dstl_forward_received_batches", "Forward calls of child nodes answered", registry=r
        )
        self.forward_received_bytes = Counter(
            "dstl_forward_received_bytes",
            "Bytes of log sections received from children",
            registry=r,
        )
        self.forward_merged_sections = Histogram(
            "dstl_forward_merged_sections",
            "Log sections of child nodes per object this node uploaded or forwarded",
            buckets=_COUNT_BUCKETS,
            registry=r,
        )
        self.forward_fallbacks = Counter(
            "dstl_forward_fallbacks",
            "Flushes meant for the parent that this node uploaded itself, by reason "
            "(unavailable, deadline, error, bad_answer, backoff)",
            ["reason"],
            registry=r,
        )
        self.forward_latency = Histogram(
            "dstl_forward_latency_seconds",
            "Round trip of a Forward call to the parent (its upload included)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
