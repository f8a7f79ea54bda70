"""The checkpoint coordinator: the driver's side of keyed state on the DSTL.

Per micro-batch the driver asks :meth:`CheckpointCoordinator.plan_batch` for
the plan its tasks get (``None`` when the batch was already checkpointed: a
re-run after a crash between our record and Spark's own commit is skipped),
runs the tasks, and hands their results to :meth:`complete_batch`, which
writes the checkpoint record (atomically, never overwritten), registers its
objects in the :class:`SharedStateRegistry`, drops checkpoints beyond the
retained number and discards the objects no retained checkpoint refers to.

Materialization is time-driven: when ``materialize_interval_s`` has passed
since the last one completed, the next plan carries the flag (so at most one
runs at a time). A batch whose materialization failed in some subtask counts
as a failure; after ``max_materialization_failures`` in a row the
coordinator raises :class:`MaterializationFailed` (after recording the
batch's checkpoint, which is complete without it).

On :meth:`start`, before the first new checkpoint, it rebuilds the registry
from the retained records and removes objects under the job's prefix that
none of them references (orphans of a crash). Listing needs the blob store:
pass ``lister`` (e.g. :func:`blob_store_lister` for ``file://`` or S3); without
one only objects of records dropped at start are discarded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dstl_client.client import ChangelogClient
from dstl_client.coordinator.metrics import CoordinatorMetrics
from dstl_client.coordinator.records import CheckpointRecord, TaskResult, next_record
from dstl_client.coordinator.registry import SharedStateRegistry
from dstl_client.coordinator.storage import CheckpointStorage
from dstl_client.core.errors import ConfigError, DstlError, InvalidArgument
from dstl_client.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    check_parallelism,
    key_group_range_for_operator,
)
from dstl_client.state.backend import DEFAULT_CACHE_ROWS
from dstl_client.state.subtask import ADDRESS_ENV, TOKEN_ENV, BatchPlan

log = logging.getLogger(__name__)

ObjectLister = Callable[[str], Iterable[str]]
"""``lister(job_id)`` -> every object key under the job's prefix."""

#: keys per DiscardObjects call (the sidecar accepts up to 10,000)
_DISCARD_CHUNK = 5_000


class MaterializationFailed(DstlError):
    """Materialization failed too many times in a row; the job stops."""

    grpc_code = "UNAVAILABLE"
    kind = "materialization_failed"


class CheckpointTimedOut(DstlError):
    """A batch's checkpoint took longer than the checkpoint timeout and was aborted."""

    grpc_code = "DEADLINE_EXCEEDED"
    kind = "checkpoint_timed_out"


class ConfigUpdateInProgress(DstlError):
    """Another configuration update of the job is running (HTTP 409)."""

    grpc_code = "ABORTED"
    kind = "config_update_in_progress"


class IncompleteBatch(DstlError):
    """Task results do not cover every subtask exactly once."""

    kind = "incomplete_batch"


def default_state_dir() -> str:
    """Node-local state directory: ``$DSTL_STATE_DIR`` or ``<tmp>/dstl-state``."""
    return os.environ.get("DSTL_STATE_DIR") or str(Path(tempfile.gettempdir()) / "dstl-state")


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Configuration of one keyed operator's checkpoints."""

    #: the job's id at the sidecar; owns the object prefix ``<job_id>/`` alone
    job_id: str
    #: directory of checkpoint records (``<checkpoint_dir>/dstl/checkpoints``)
    checkpoint_dir: str
    operator_id: str = "keyed"
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    #: checkpoints kept (the newest); older ones are dropped with their objects
    retain: int = 2
    materialize_interval_s: float = 30.0
    max_materialization_failures: int = 3
    #: baseline mode: snapshot every key group at every materialization
    full_snapshot: bool = False
    #: node-local state stores (default :func:`default_state_dir`)
    state_dir: str = ""
    #: the driver's sidecar; tasks prefer ``$DSTL_ADDRESS`` of their node
    dstl_address: str = ""
    dstl_token: str | None = None
    persist_timeout_s: float = 120.0
    #: a batch's checkpoint (plan to record) taking longer is aborted
    checkpoint_timeout_s: float = 600.0
    cache_rows: int = DEFAULT_CACHE_ROWS
    fsync: bool = True

    def validate(self) -> None:
        from dstl_client.core.keys import check_job_id

        try:
            check_job_id(self.job_id)
        except InvalidArgument as exc:
            raise ConfigError(exc.message) from None
        check_parallelism(1, self.max_parallelism)
        if self.retain < 1:
            raise ConfigError(f"retain={self.retain}: keep at least one checkpoint")
        if self.materialize_interval_s < 0:
            raise ConfigError("materialize_interval_s must be >= 0")
        if self.max_materialization_failures < 1:
            raise ConfigError("max_materialization_failures must be >= 1")
        if self.persist_timeout_s <= 0:
            raise ConfigError("persist_timeout_s must be > 0")
        if self.checkpoint_timeout_s <= 0:
            raise ConfigError("checkpoint_timeout_s must be > 0")

    @property
    def records_dir(self) -> Path:
        return Path(self.checkpoint_dir) / "dstl" / "checkpoints"


def blob_store_lister(storage_url: str) -> ObjectLister:
    """List a job's objects straight from the sidecar's blob store (``file://`` or S3).

    The driver needs read access to the store (and S3 credentials for S3).
    """

    def lister(job_id: str) -> list[str]:
        from dstl_client.core.keys import job_prefix
        from dstl_server.storage import open_store

        async def run() -> list[str]:
            store = open_store(storage_url)
            try:
                return [info.key async for info in store.list(job_prefix(job_id))]
            finally:
                await store.close()

        return asyncio.run(run())

    return lister


def _write_atomically(path: Path, data: bytes, fsync: bool) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, directory fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CheckpointCoordinator:
    """Plans batches, records checkpoints, counts references, cleans up."""

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        client: ChangelogClient | None = None,
        lister: ObjectLister | None = None,
        metrics: CoordinatorMetrics | None = None,
    ) -> None:
        if not config.state_dir:
            config = replace(config, state_dir=default_state_dir())
        if not config.dstl_address:
            config = replace(config, dstl_address=os.environ.get(ADDRESS_ENV, ""))
        if config.dstl_token is None and os.environ.get(TOKEN_ENV):
            config = replace(config, dstl_token=os.environ[TOKEN_ENV])
        config.validate()
        self.config = config
        self.storage = CheckpointStorage(config.records_dir, fsync=config.fsync)
        self.registry = SharedStateRegistry()
        self.metrics = metrics or CoordinatorMetrics(config.job_id)
        self._client = client
        self._own_client = False
        self._lister = lister
        self._retained: deque[CheckpointRecord] = deque()
        self.latest: CheckpointRecord | None = None
        self._last_mat_done = time.monotonic()
        self._mat_failures = 0
        self._undiscarded: set[str] = set()
        self._lock = threading.RLock()
        self.started = False
        self.orphans_removed = 0
        #: the batch being checkpointed and when it was planned (monotonic)
        self._in_flight: tuple[int, float] | None = None
        self._aborted: set[int] = set()
        #: called with the batch id when its checkpoint times out (e.g. cancels its Spark jobs)
        self.on_timeout: Callable[[int], None] | None = None
        self.config_update_lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        self._closing = threading.Event()
        #: per-checkpoint statistics (the newest 10,000)
        self.history: deque[dict[str, Any]] = deque(maxlen=10_000)

    # ------------------------------------------------------------ plumbing
    @property
    def client(self) -> ChangelogClient:
        if self._client is None:
            if not self.config.dstl_address:
                raise ConfigError(f"no sidecar address: pass dstl_address or set {ADDRESS_ENV}")
            self._client = ChangelogClient(self.config.dstl_address, token=self.config.dstl_token)
            self._own_client = True
        return self._client

    def close(self) -> None:
        self._closing.set()
        if self._watchdog is not None:
            self._watchdog.join(5)
            self._watchdog = None
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None
        self.metrics.close()

    def set_materialize_interval(self, seconds: float) -> None:
        """Change the materialization interval of the running job (not persisted)."""
        if seconds < 0:
            raise ConfigError("materialize_interval_s must be >= 0")
        with self._lock:
            self.config = replace(self.config, materialize_interval_s=seconds)

    # ------------------------------------------------- dynamic configuration
    @property
    def overrides_path(self) -> Path:
        return Path(self.config.checkpoint_dir) / "dstl" / "config-overrides.json"

    def effective_config(self) -> dict[str, Any]:
        """The values in force (``GET .../checkpoints/config``); durations in ms."""
        with self._lock:
            cfg = self.config
            return {
                "jobId": cfg.job_id,
                "checkpointTimeout": round(cfg.checkpoint_timeout_s * 1000),
                "materializationInterval": round(cfg.materialize_interval_s * 1000),
                "retainedCheckpoints": cfg.retain,
            }

    def update_config(
        self,
        *,
        checkpoint_timeout_ms: int | None = None,
        materialization_interval_ms: int | None = None,
    ) -> dict[str, Any]:
        """Change timeout and/or materialization interval of the running job.

        The new values are persisted next to the checkpoint records first (so a
        restarted driver applies them again), then applied: a new timeout also
        governs the batch in flight (extended: it may finish; shortened below
        its elapsed time: it is aborted at once). Raises :class:`ConfigError`
        for invalid values and :class:`ConfigUpdateInProgress` when another
        update is running.
        """
        for name, value in (
            ("checkpointTimeout", checkpoint_timeout_ms),
            ("materializationInterval", materialization_interval_ms),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise ConfigError(f"{name} must be a positive integer (milliseconds)")
        if not self.config_update_lock.acquire(blocking=False):
            raise ConfigUpdateInProgress("another configuration update is in progress")
        try:
            with self._lock:
                overrides = self._read_overrides()
                if checkpoint_timeout_ms is not None:
                    overrides["checkpointTimeout"] = checkpoint_timeout_ms
                if materialization_interval_ms is not None:
                    overrides["materializationInterval"] = materialization_interval_ms
                _write_atomically(
                    self.overrides_path, json.dumps(overrides).encode(), self.config.fsync
                )
                self._apply_overrides(overrides)
            self._check_timeout()
            return self.effective_config()
        finally:
            self.config_update_lock.release()

    def _read_overrides(self) -> dict[str, int]:
        try:
            doc = json.loads(self.overrides_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"unreadable {self.overrides_path}: {exc}") from None
        return {
            k: int(v)
            for k, v in doc.items()
            if k in ("checkpointTimeout", "materializationInterval")
        }

    def _apply_overrides(self, overrides: dict[str, int]) -> None:
        cfg = self.config
        if "checkpointTimeout" in overrides:
            cfg = replace(cfg, checkpoint_timeout_s=overrides["checkpointTimeout"] / 1000)
        if "materializationInterval" in overrides:
            cfg = replace(cfg, materialize_interval_s=overrides["materializationInterval"] / 1000)
        cfg.validate()
        self.config = cfg

    def _check_timeout(self) -> None:
        """Abort the batch in flight if it outlived the checkpoint timeout."""
        with self._lock:
            if self._in_flight is None:
                return
            batch, started = self._in_flight
            if batch in self._aborted:
                return
            if time.monotonic() - started <= self.config.checkpoint_timeout_s:
                return
            self._aborted.add(batch)
            callback = self.on_timeout
            self.metrics.checkpoint_timeouts.inc()
        log.warning(
            "checkpoint of batch %d exceeded the timeout of %.1fs: aborted",
            batch,
            self.config.checkpoint_timeout_s,
        )
        if callback is not None:
            try:
                callback(batch)
            except Exception:
                log.exception("aborting batch %d failed", batch)

    def end_batch(self, batch_id: int) -> None:
        """The batch is over without a record (its tasks failed): nothing in flight."""
        with self._lock:
            if self._in_flight is not None and self._in_flight[0] == batch_id:
                self._in_flight = None

    def start_watchdog(self, period_s: float = 0.2) -> None:
        """Check the checkpoint timeout of the batch in flight every ``period_s``."""

        def loop() -> None:
            while not self._closing.wait(period_s):
                self._check_timeout()

        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=loop, name="dstl-checkpoint-timeout", daemon=True
            )
            self._watchdog.start()

    # ---------------------------------------------------------------- start
    def start(self) -> CheckpointRecord | None:
        """Load retained checkpoints, rebuild the registry, remove orphans."""
        with self._lock:
            self._apply_overrides(self._read_overrides())
            cfg = self.config
            self.storage.remove_temp_files()
            ids = self.storage.batch_ids()
            keep_ids = ids[-cfg.retain :]
            drop_ids = ids[: -cfg.retain] if len(ids) > cfg.retain else []
            retained = [self.storage.load(b) for b in keep_ids]
            for rec in retained:
                if rec.job_id != cfg.job_id or rec.operator_id != cfg.operator_id:
                    raise ConfigError(
                        f"{self.storage.path_of(rec.batch_id)} belongs to job {rec.job_id!r} "
                        f"operator {rec.operator_id!r}, not {cfg.job_id!r} {cfg.operator_id!r}"
                    )
                if rec.max_parallelism != cfg.max_parallelism:
                    raise ConfigError(
                        f"max_parallelism={cfg.max_parallelism} but the checkpoints were taken "
                        f"with {rec.max_parallelism}: it is fixed when a job is created"
                    )
                self.registry.register(rec.batch_id, rec.object_keys())
                self._retained.append(rec)
            dropped_keys: set[str] = set()
            for b in drop_ids:
                try:
                    dropped_keys |= self.storage.load(b).object_keys()
                except (DstlError, OSError, ValueError) as exc:
                    log.warning("unreadable old checkpoint record %d: %s", b, exc)
                self.storage.delete(b)
            referenced = self.registry.referenced()
            orphans: set[str] = set()
            if self._lister is not None:
                orphans = {k for k in self._lister(cfg.job_id) if k not in referenced}
            else:
                orphans = dropped_keys - referenced
            if orphans:
                n = self._discard(orphans)
                self.metrics.orphans.inc(n)
                log.info("removed %d orphaned objects of job %s", n, cfg.job_id)
            self.latest = retained[-1] if retained else None
            if self.latest is not None:
                self.metrics.last_batch.set(self.latest.batch_id)
            self._last_mat_done = time.monotonic()
            self.started = True
            self.orphans_removed = len(orphans)
            return self.latest

    # ---------------------------------------------------------------- plans
    def plan_batch(self, batch_id: int, parallelism: int) -> BatchPlan | None:
        """The plan of ``batch_id``, or ``None`` if it is already checkpointed."""
        with self._lock:
            if not self.started:
                raise RuntimeError("call start() first")
            cfg = self.config
            check_parallelism(parallelism, cfg.max_parallelism)
            if self.latest is not None and batch_id <= self.latest.batch_id:
                self.metrics.skipped_batches.inc()
                log.info("batch %d is already checkpointed: skipped", batch_id)
                return None
            now = time.monotonic()
            due = now - self._last_mat_done >= cfg.materialize_interval_s
            self._in_flight = (batch_id, now)
            self._aborted.discard(batch_id)
            return BatchPlan(
                job_id=cfg.job_id,
                operator_id=cfg.operator_id,
                batch_id=batch_id,
                parallelism=parallelism,
                max_parallelism=cfg.max_parallelism,
                state_dir=cfg.state_dir,
                committed=None if self.latest is None else self.latest.for_tasks(),
                dstl_address=cfg.dstl_address or None,
                dstl_token=cfg.dstl_token,
                materialize=self.latest is not None and due,
                full_snapshot=cfg.full_snapshot,
                persist_timeout_s=min(cfg.persist_timeout_s, cfg.checkpoint_timeout_s),
                cache_rows=cfg.cache_rows,
            )

    # ------------------------------------------------------------- complete
    def complete_batch(
        self,
        plan: BatchPlan,
        results: Sequence[TaskResult],
        *,
        source_progress: Any = None,
        started_monotonic: float | None = None,
    ) -> CheckpointRecord:
        """Record the checkpoint of a batch whose tasks all succeeded."""
        with self._lock:
            cfg = self.config
            self._check_results(plan, results)
            self._check_timeout()
            if plan.batch_id in self._aborted:
                self._in_flight = None
                raise CheckpointTimedOut(
                    f"the checkpoint of batch {plan.batch_id} exceeded the timeout of "
                    f"{cfg.checkpoint_timeout_s:.1f}s and was aborted"
                )
            t0 = time.perf_counter()
            mat_failed = [r for r in results if r.mat_error]
            mat_done = plan.materialize and not mat_failed
            stats = self._batch_stats(results)
            record = next_record(
                self.latest,
                job_id=cfg.job_id,
                operator_id=cfg.operator_id,
                batch_id=plan.batch_id,
                max_parallelism=cfg.max_parallelism,
                parallelism=plan.parallelism,
                results=results,
                source_progress=source_progress,
                created_unix=time.time(),
                stats=stats,
            )
            self.storage.write(record)
            record_s = time.perf_counter() - t0
            self.registry.register(record.batch_id, record.object_keys())
            self._retained.append(record)
            self.latest = record
            self._in_flight = None
            unused: set[str] = set(self._undiscarded)
            while len(self._retained) > cfg.retain:
                old = self._retained.popleft()
                self.storage.delete(old.batch_id)
                unused.update(self.registry.unregister(old.batch_id))
            # an object is discarded only while no retained checkpoint refers to it
            unused = {k for k in unused if not self.registry.is_referenced(k)}
            discarded = self._discard(unused) if unused else 0
            # statistics and metrics
            stats["record_s"] = round(record_s, 4)
            stats["checkpoint_s"] = round(stats["persist_max_s"] + record_s, 4)
            stats["discarded_objects"] = discarded
            stats["checkpoint_size_bytes"] = sum(
                h.stored_bytes for h in record.parts.values()
            ) + sum(s.handle.stored_bytes for s in record.segments)
            stats["segments"] = len(record.segments)
            stats["parts"] = len(record.parts)
            if started_monotonic is not None:
                stats["batch_s"] = round(time.monotonic() - started_monotonic, 4)
            stats["batch_id"] = plan.batch_id
            stats["materialized"] = mat_done
            self.history.append(stats)
            m = self.metrics
            m.checkpoints.inc()
            m.last_batch.set(plan.batch_id)
            m.checkpoint_duration.observe(stats["checkpoint_s"])
            m.checkpoint_bytes.observe(stats["persisted_bytes"])
            m.state_bytes.set(stats["state_bytes"])
            m.checkpoint_size.set(stats["checkpoint_size_bytes"])
            m.segments.set(len(record.segments))
            m.rows.inc(stats["rows"])
            m.restores.inc(stats["restored_subtasks"])
            m.discarded_objects.inc(discarded)
            if "batch_s" in stats:
                m.batch_duration.observe(stats["batch_s"])
            if plan.materialize:
                if mat_done:
                    self._mat_failures = 0
                    self._last_mat_done = time.monotonic()
                    m.materializations.inc()
                    m.materialization_duration.observe(stats["mat_max_s"])
                    m.materialization_bytes.observe(stats["mat_bytes"])
                else:
                    self._mat_failures += 1
                    m.materialization_failures.inc()
            log.info(
                "checkpoint %d: %d rows, persisted %d B in %.3fs (record %.3fs), state %d B%s",
                plan.batch_id,
                stats["rows"],
                stats["persisted_bytes"],
                stats["checkpoint_s"],
                record_s,
                stats["state_bytes"],
                f", materialized {stats['mat_bytes']} B in {stats['mat_max_s']:.3f}s"
                if mat_done
                else "",
            )
            if mat_failed and self._mat_failures >= cfg.max_materialization_failures:
                errors = "; ".join(f"subtask {r.index}: {r.mat_error}" for r in mat_failed[:3])
                raise MaterializationFailed(
                    f"materialization failed {self._mat_failures} times in a row "
                    f"(max_materialization_failures={cfg.max_materialization_failures}); "
                    f"last errors: {errors}"
                )
            return record

    def _check_results(self, plan: BatchPlan, results: Sequence[TaskResult]) -> None:
        seen: dict[int, TaskResult] = {}
        for r in results:
            if r.batch_id != plan.batch_id:
                raise IncompleteBatch(f"result of batch {r.batch_id} in batch {plan.batch_id}")
            if r.index in seen:
                raise IncompleteBatch(f"two results for subtask {r.index}")
            rng = key_group_range_for_operator(r.index, plan.parallelism, plan.max_parallelism)
            if (r.first, r.last) != rng.as_tuple():
                raise IncompleteBatch(f"subtask {r.index} reports range [{r.first}, {r.last}]")
            seen[r.index] = r
        missing = sorted(set(range(plan.parallelism)) - set(seen))
        if missing:
            raise IncompleteBatch(f"batch {plan.batch_id}: no result from subtasks {missing}")

    @staticmethod
    def _batch_stats(results: Sequence[TaskResult]) -> dict[str, Any]:
        def total(name: str) -> int:
            return int(sum(r.stats.get(name, 0) or 0 for r in results))

        def peak(name: str) -> float:
            return float(max((r.stats.get(name, 0) or 0 for r in results), default=0.0))

        return {
            "rows": total("rows"),
            "keys": total("keys"),
            "changes": total("changes"),
            "logged_bytes": total("logged_bytes"),
            "persisted_bytes": total("persisted_bytes"),
            "state_bytes": total("state_bytes"),
            "persist_max_s": round(peak("persist_s"), 4),
            "apply_max_s": round(peak("apply_s"), 4),
            "task_max_s": round(peak("task_s"), 4),
            "mat_max_s": round(peak("mat_s"), 4),
            "mat_bytes": total("mat_bytes"),
            "mat_kgs": total("mat_kgs"),
            "restored_subtasks": sum(1 for r in results if r.stats.get("restored")),
            "restore_max_s": round(peak("restore_s"), 4),
            "mat_errors": [r.mat_error for r in results if r.mat_error][:3],
            "max_task_attempt": int(peak("task_attempt")),
        }

    # -------------------------------------------------------------- discard
    def _discard(self, keys: Iterable[str]) -> int:
        """Delete objects through the sidecar; failures are retried at the next chance."""
        todo = sorted(set(keys))
        deleted = 0
        for i in range(0, len(todo), _DISCARD_CHUNK):
            chunk = todo[i : i + _DISCARD_CHUNK]
            try:
                deleted += self.client.discard_objects(self.config.job_id, chunk)
                self._undiscarded.difference_update(chunk)
            except DstlError as exc:
                log.warning("discarding %d objects failed (retried later): %s", len(chunk), exc)
                self._undiscarded.update(chunk)
        return deleted

    @property
    def retained(self) -> list[CheckpointRecord]:
        with self._lock:
            return list(self._retained)
