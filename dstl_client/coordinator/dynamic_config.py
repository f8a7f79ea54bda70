"""The configuration in force of a running job, and its changes while it runs.

A :class:`~.coordinator.CheckpointCoordinator` starts from the job's
:class:`~.config.CoordinatorConfig`; the REST endpoint (:mod:`.rest`,
FLIP-571) changes its checkpoint interval, checkpoint timeout and
materialization interval while the job runs. :class:`DynamicConfig` holds
that configuration: the persisted overrides applied on start, each update
persisted (:class:`~.overrides.ConfigOverrides`) before it is applied, a new
timeout handed to the watchdog of the batch in flight, a new interval to the
query (which switches its trigger between two batches).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dstl_client.coordinator.config import CheckpointSettings, CoordinatorConfig
from dstl_client.coordinator.metadata import MetadataStore
from dstl_client.coordinator.overrides import (
    INTERVAL,
    MATERIALIZATION,
    TIMEOUT,
    ConfigOverrides,
    ConfigUpdateInProgress,
    apply_overrides,
    check_override,
)
from dstl_client.core.errors import ConfigError


class DynamicConfig:
    """The configuration in force of one operator's coordinator (:attr:`config`).

    Invariants: :attr:`config` is always validated; after :meth:`apply_persisted`
    it carries the persisted overrides; an update is validated, then persisted,
    then applied (nothing is applied when persisting fails); one update runs at
    a time (:attr:`update_lock`, taken without waiting: a second one gets
    :class:`~.overrides.ConfigUpdateInProgress`).

    Threads: :meth:`update` and :meth:`effective` on REST handler threads,
    :meth:`apply_persisted` and :meth:`set_materialize_interval` on the
    driver's; :attr:`config` is replaced (never mutated) under ``lock``, the
    coordinator's lock, which its readers of several values hold too.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        metadata: MetadataStore,
        lock: threading.RLock,
        timeout_changed: Callable[[], None],
    ) -> None:
        """``metadata``: the job's store, where the overrides are persisted (its
        ``config.overrides_name``); ``timeout_changed``: called after every update,
        outside ``lock`` (the watchdog checks the batch in flight against the
        timeout now in force)."""
        self.config = config
        self._overrides = ConfigOverrides(metadata, config.overrides_name)
        self._lock = lock
        self._timeout_changed = timeout_changed
        #: called (on the updating thread) with a new checkpoint interval in seconds
        self.on_interval_change: Callable[[float], None] | None = None

    @property
    def location(self) -> str:
        """Where the REST overrides are persisted (a path or URL)."""
        return self._overrides.location

    @property
    def update_lock(self) -> threading.Lock:
        """Held while a configuration update runs (a second one gets a 409)."""
        return self._overrides.update_lock

    def apply_persisted(self) -> CoordinatorConfig:
        """Apply the persisted overrides (a restarted driver's); the configuration then."""
        with self._lock:
            self.config = apply_overrides(self.config, self._overrides.read())
            return self.config

    def set_materialize_interval(self, seconds: float) -> None:
        """Change the materialization interval of the running job (not persisted)."""
        if seconds < 0:
            raise ConfigError("materialize_interval_s must be >= 0")
        with self._lock:
            self.config = replace(self.config, materialize_interval_s=seconds)

    def effective(self) -> dict[str, Any]:
        """The values in force (``GET .../checkpoints/configuration``); durations in ms.

        ``sources`` says where each tunable came from: ``override`` (the REST
        endpoint, persisted), ``job config`` (the job's options) or ``default``.
        """
        with self._lock:
            cfg = self.config
            overrides = self._overrides.read()
            defaults = CheckpointSettings()
            values = {
                INTERVAL: (cfg.checkpoint_interval_s, defaults.checkpoint_interval_s),
                TIMEOUT: (cfg.checkpoint_timeout_s, defaults.checkpoint_timeout_s),
                MATERIALIZATION: (cfg.materialize_interval_s, defaults.materialize_interval_s),
            }
            return {
                "jobId": cfg.job_id,
                **{name: round(v * 1000) for name, (v, _d) in values.items()},
                "retainedCheckpoints": cfg.retain,
                "sources": {
                    name: "override"
                    if name in overrides
                    else ("default" if v == d else "job config")
                    for name, (v, d) in values.items()
                },
            }

    def update(
        self,
        *,
        checkpoint_interval_ms: int | None = None,
        checkpoint_timeout_ms: int | None = None,
        materialization_interval_ms: int | None = None,
    ) -> dict[str, Any]:
        """Change the interval, timeout and/or materialization interval of the running job.

        The new values are persisted in the job's metadata store first (so a
        restarted driver applies them again), then applied: a new timeout also
        governs the batch in flight (extended: it may finish; shortened below
        its elapsed time: it is aborted at once); a new interval goes to
        :attr:`on_interval_change` (the query switches its trigger between
        two batches). Returns :meth:`effective`. Raises :class:`ConfigError`
        for invalid values, :class:`~.overrides.ConfigUpdateInProgress` when
        another update is running and :class:`~.metadata.MetadataStoreError`
        when the update could not be persisted (nothing applied).
        """
        changes: dict[str, int] = {}
        for name, value in (
            (INTERVAL, checkpoint_interval_ms),
            (TIMEOUT, checkpoint_timeout_ms),
            (MATERIALIZATION, materialization_interval_ms),
        ):
            if value is not None:
                check_override(name, value)
                changes[name] = value
        if not self._overrides.update_lock.acquire(blocking=False):
            raise ConfigUpdateInProgress("another configuration update is in progress")
        try:
            with self._lock:
                before = self.config.checkpoint_interval_s
                self.config, _ = self._overrides.update(self.config, changes)
                interval = self.config.checkpoint_interval_s
            self._timeout_changed()
            listener = self.on_interval_change
            if interval != before and listener is not None:
                listener(interval)
            return self.effective()
        finally:
            self._overrides.update_lock.release()
