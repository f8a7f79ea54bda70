"""The checkpoint coordinator: the driver's side of keyed state on the DSTL.

Per micro-batch the driver asks :meth:`CheckpointCoordinator.plan_batch` for
the plan its tasks get (``None`` when the batch was already checkpointed: a
re-run after a crash between our record and Spark's own commit is skipped),
runs the tasks, and hands their results to :meth:`complete_batch`, which
writes the checkpoint record (atomically, never overwritten) and retains it.

The coordinator only sequences its parts, each with one role:

* :mod:`.batches`: the plan, the completeness of results, the
  materialization schedule and its failure policy;
* :mod:`.retention`: retained records, the shared state registry, discards,
  orphans;
* :mod:`.watchdog`: the checkpoint timeout of the batch in flight;
* :mod:`.dynamic_config`: the configuration in force and its REST updates
  (persisted by :mod:`.overrides`);
* :mod:`.lifecycle`: restoring a chosen checkpoint (``restore_from``);
* :mod:`.stats` and :mod:`.metrics`: per-checkpoint statistics and metrics.

On :meth:`start`, before the first new checkpoint, it rebuilds the registry
from the retained records and removes orphans of a crash through the
sidecar (:class:`~dstl_client.coordinator.cleanup.OrphanSweeper`: the job's
unreferenced objects older than ``orphan_grace_s``).

Records and overrides are in the job's metadata store
(:mod:`.metadata`, at ``metadata_url``: a directory or ``s3://``), so a
driver restarted on another machine with an empty disk resumes from the
last record. Two drivers of one job racing for a batch write one record:
the other gets :class:`~.storage.CheckpointExists`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.checkpoint.next_record import next_record
from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.checkpoint.stats import CheckpointStats
from dstl_client.client import ChangelogClient
from dstl_client.connect import ADDRESS_ENV, require_address
from dstl_client.coordinator.batches import (
    MaterializationSchedule,
    check_results,
    make_plan,
    tail_due,
)
from dstl_client.coordinator.cleanup import OrphanSweeper
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.dynamic_config import DynamicConfig
from dstl_client.coordinator.last_writers import LastWriters
from dstl_client.coordinator.lifecycle import DisposeResult, dispose_operator
from dstl_client.coordinator.metadata import MetadataStore
from dstl_client.coordinator.metrics import CoordinatorMetrics
from dstl_client.coordinator.registry import SharedStateRegistry
from dstl_client.coordinator.retention import RetainedCheckpoints, Sweeper, SweeperFactory
from dstl_client.coordinator.rollback import RestoreResult, restore_on_start
from dstl_client.coordinator.schema_evolution import adopt
from dstl_client.coordinator.state_schemas import OperatorSchemas
from dstl_client.coordinator.storage import CheckpointStorage
from dstl_client.coordinator.watchdog import CheckpointWatchdog
from dstl_client.core.errors import ConfigError
from dstl_client.keygroups import check_parallelism

log = logging.getLogger(__name__)


def _orphan_sweeper(client: ChangelogClient, job_id: str, grace_s: float) -> Sweeper:
    return OrphanSweeper(client, job_id, grace_s=grace_s)


class CheckpointCoordinator:
    """Plans batches and records their checkpoints, for one keyed operator.

    Invariants: :meth:`start` runs before the first plan; records are written
    in batch order, each once, and a batch at or below the latest record is
    skipped; a batch's record is written only when every subtask reported
    exactly once and its checkpoint did not time out; orphans are removed
    before the first new checkpoint.

    Threads: :meth:`plan_batch`, :meth:`complete_batch` and :meth:`end_batch`
    on the driver's batch thread (``foreachBatch``); :meth:`update_config`
    and :meth:`effective_config` on REST handler threads; the watchdog on its
    own thread. The coordinator's state is guarded by one lock.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        client: ChangelogClient | None = None,
        metrics: CoordinatorMetrics | None = None,
        sweeper: SweeperFactory | None = None,
        metadata: MetadataStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: seconds, monotonic; what the checkpoint timeout and the
        materialization interval are measured on (a test passes a fake one)."""
        config = config.resolved()
        config.validate()
        #: the job's metadata store (``metadata``, else opened from the config and owned)
        self.metadata = metadata or config.open_metadata()
        self._own_metadata = metadata is None
        self.storage = CheckpointStorage(self.metadata, config.records_prefix)
        self.metrics = metrics or CoordinatorMetrics(config.job_id)
        self.metrics.watch(lambda: self.config, lambda: self.metadata.retries)
        self._client = client
        self._own_client = False
        self._sweeper = sweeper or _orphan_sweeper
        self._lock = threading.RLock()
        self._retention = RetainedCheckpoints(config, self.storage, lambda: self.client)
        self._schedule = MaterializationSchedule(clock)
        self._watchdog = CheckpointWatchdog(
            lambda: self.config.checkpoint_timeout_s,
            on_abort=self.metrics.checkpoint_timeouts.inc,
            clock=clock,
        )
        self._dynamic = DynamicConfig(config, self.metadata, self._lock, self._watchdog.check)
        self.started = False
        self.orphans_removed = 0
        #: what :meth:`start` restored (``restore_from``), if anything
        self.restored: RestoreResult | None = None
        #: per-checkpoint statistics (the newest 10,000)
        self.history: deque[CheckpointStats] = deque(maxlen=10_000)
        #: the changelog writers of the last recorded batch (closed by :meth:`close_writers`)
        self._writers = LastWriters()
        #: the id of the state schema document this run's records name (:meth:`adopt_schemas`)
        self.state_schema: str | None = None

    # ------------------------------------------------------------ plumbing
    @property
    def client(self) -> ChangelogClient:
        if self._client is None:
            how = f"pass dstl_address or set {ADDRESS_ENV}"
            address = require_address(self.config.dstl_address, how)
            self._client = ChangelogClient(address, token=self.config.dstl_token)
            self._own_client = True
        return self._client

    @property
    def latest(self) -> CheckpointRecord | None:
        return self._retention.latest

    @property
    def retained(self) -> list[CheckpointRecord]:
        with self._lock:
            return self._retention.records

    @property
    def registry(self) -> SharedStateRegistry:
        return self._retention.registry

    def close_writers(self) -> int:
        """Close the changelog writers of the last recorded batch's subtasks; how many.

        Best effort, through the driver's sidecar with the job's token (see
        :meth:`.LastWriters.close`: those of other nodes close when idle).
        """
        return self._writers.close(lambda: self.client, self.config.job_id)

    def dispose(self) -> DisposeResult:
        """Delete this operator's checkpoints, the objects only they use and its Spark checkpoint.

        For a stopped query (``DstlQuery.stop(cancel=True)`` with
        ``retain_on_cancel=False``); see
        :func:`~dstl_client.coordinator.lifecycle.dispose_operator`.
        """
        with self._lock:
            try:
                client: ChangelogClient | None = self.client
            except ConfigError:
                client = None
            result = dispose_operator(self.config, self.metadata, client=client)
            self._retention = RetainedCheckpoints(self.config, self.storage, lambda: self.client)
            self._writers.forget()
            return result

    def close(self) -> None:
        self._watchdog.close()
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None
        if self._own_metadata:
            self.metadata.close()
        self.metrics.close()

    # --------------------------------- dynamic configuration (:mod:`.dynamic_config`)
    @property
    def config(self) -> CoordinatorConfig:
        """The configuration in force: the job's, with the REST overrides applied."""
        return self._dynamic.config

    @property
    def overrides_location(self) -> str:
        """Where the REST overrides are persisted (a path or URL)."""
        return self._dynamic.location

    @property
    def config_update_lock(self) -> threading.Lock:
        """Held while a configuration update runs (a second one gets a 409)."""
        return self._dynamic.update_lock

    @property
    def on_interval_change(self) -> Callable[[float], None] | None:
        """Called (on the updating thread) with a new checkpoint interval in seconds."""
        return self._dynamic.on_interval_change

    @on_interval_change.setter
    def on_interval_change(self, listener: Callable[[float], None] | None) -> None:
        self._dynamic.on_interval_change = listener

    def set_materialize_interval(self, seconds: float) -> None:
        """Change the materialization interval of the running job (not persisted)."""
        self._dynamic.set_materialize_interval(seconds)

    def effective_config(self) -> dict[str, Any]:
        """The values in force, in ms, and where each came from (:meth:`.DynamicConfig.effective`)."""
        return self._dynamic.effective()

    def update_config(
        self,
        *,
        checkpoint_interval_ms: int | None = None,
        checkpoint_timeout_ms: int | None = None,
        materialization_interval_ms: int | None = None,
    ) -> dict[str, Any]:
        """Persist, then apply new values to the running job (:meth:`.DynamicConfig.update`)."""
        return self._dynamic.update(
            checkpoint_interval_ms=checkpoint_interval_ms,
            checkpoint_timeout_ms=checkpoint_timeout_ms,
            materialization_interval_ms=materialization_interval_ms,
        )

    # ------------------------------------------------------------- timeouts
    @property
    def on_timeout(self) -> Callable[[int], None] | None:
        """Called with the batch id when its checkpoint times out (e.g. cancels its jobs)."""
        return self._watchdog.on_timeout

    @on_timeout.setter
    def on_timeout(self, callback: Callable[[int], None] | None) -> None:
        self._watchdog.on_timeout = callback

    def start_watchdog(self, period_s: float = 0.2) -> None:
        """Check the checkpoint timeout of the batch in flight every ``period_s``."""
        self._watchdog.start(period_s)

    def was_aborted(self, batch_id: int) -> bool:
        """Whether the watchdog aborted the checkpoint of ``batch_id`` (its timeout passed)."""
        return self._watchdog.was_aborted(batch_id)

    def end_batch(self, batch_id: int) -> None:
        """The batch is over without a record (its tasks failed): nothing in flight."""
        self._watchdog.end(batch_id)

    # ---------------------------------------------------------------- start
    def start(self) -> CheckpointRecord | None:
        """Restore a chosen checkpoint if asked, load retained checkpoints, rebuild the
        registry, remove orphans.

        With ``restore_from=N`` (once per N, see :mod:`.lifecycle`) the records
        after N and Spark's progress past N are moved aside first, so N is the
        latest record and the query resumes after it.
        """
        with self._lock:
            cfg = self._dynamic.apply_persisted()
            # a restore interrupted earlier is finished; restore_from applies once per batch id
            self.restored = restore_on_start(cfg, self.metadata, cfg.spark_checkpoint_dir)
            dropped = self._retention.load()
            sweeper: Sweeper | None = None
            try:
                sweeper = self._sweeper(self.client, cfg.job_id, cfg.orphan_grace_s)
            except ConfigError as exc:
                log.warning("no orphan sweep of job %s: %s", cfg.job_id, exc)
            removed = self._retention.remove_orphans(dropped, sweeper)
            if removed:
                self.metrics.orphans.inc(removed)
                log.info("removed %d orphaned objects of job %s", removed, cfg.job_id)
            latest = self.latest
            if latest is not None:
                self.metrics.last_batch.set(latest.batch_id)
            self._schedule.restart()
            self.started = True
            self.orphans_removed = removed
            return latest

    def adopt_schemas(self, declared: OperatorSchemas, deleted: Iterable[str] = ()) -> str:
        """After :meth:`start`, before the first plan: check the declared state schemas
        against the latest record's and record them (:func:`.schema_evolution.adopt`).

        Raises :class:`~.schema_evolution.StateSchemaMismatch` naming the state and both schemas.
        """
        with self._lock:
            latest = self.latest
            self.state_schema = adopt(
                self.metadata,
                self.config.records_prefix,
                None if latest is None else latest.state_schema,
                declared,
                deleted,
            )
            return self.state_schema

    # ---------------------------------------------------------------- plans
    def plan_batch(self, batch_id: int, parallelism: int) -> BatchPlan | None:
        """The plan of ``batch_id``, or ``None`` if it is already checkpointed."""
        with self._lock:
            if not self.started:
                raise RuntimeError("call start() first")
            cfg = self.config
            check_parallelism(parallelism, cfg.max_parallelism)
            latest = self.latest
            if latest is not None and batch_id <= latest.batch_id:
                self.metrics.skipped_batches.inc()
                log.info("batch %d is already checkpointed: skipped", batch_id)
                return None
            materialize, mat_round = self._schedule.plan(
                None if latest is None else latest.batch_id,
                parallelism,
                cfg.materialize_interval_s,
                cfg.materialization_timeout_s,
                tail_due=tail_due(latest, cfg),
            )
            plan = make_plan(
                cfg,
                batch_id,
                parallelism,
                latest,
                materialize=materialize,
                mat_round=mat_round,
                mat_round_id=self._schedule.round_id,
                materialization_wait_s=self._schedule.wait_s(
                    cfg.materialization_wait_s, cfg.materialization_timeout_s
                ),
            )
            self._watchdog.begin(batch_id)
            return plan

    # ------------------------------------------------------------- complete
    def complete_batch(
        self,
        plan: BatchPlan,
        results: Sequence[TaskResult],
        *,
        source_progress: Any = None,
        started_monotonic: float | None = None,
    ) -> CheckpointRecord:
        """Record the checkpoint of a batch whose tasks all succeeded.

        Raises :class:`~.batches.IncompleteBatch`,
        :class:`~.watchdog.CheckpointTimedOut` (nothing recorded) and, after
        recording, :class:`~.batches.MaterializationFailed`.
        """
        with self._lock:
            cfg = self.config
            check_results(plan, results)
            self._watchdog.raise_if_aborted(plan.batch_id)
            t0 = time.perf_counter()
            # only the reports of the materialization round in flight enter the record
            results = self._schedule.accepted(plan, results)
            stats = CheckpointStats.of_tasks(
                plan.batch_id, self._schedule.would_complete(results), results
            )
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
                state_schema=self.state_schema,
            )
            stats = record.sized(stats)
            record = replace(record, stats=stats)
            self.storage.write(record)
            record_s = time.perf_counter() - t0
            self._watchdog.end(plan.batch_id)
            discarded = self._retention.add(record)
            self._writers.recorded(results)
            stats = stats.completed(
                record_s=record_s,
                discarded_objects=discarded,
                batch_s=None if started_monotonic is None else time.monotonic() - started_monotonic,
            )
            self.history.append(stats)
            ended = self._schedule.completed(results)
            self.metrics.observe_checkpoint(stats, ended, self._schedule.last_round)
            log.info("%s", stats.describe())
            self._schedule.raise_if_exhausted(cfg.max_materialization_failures)
            return record
