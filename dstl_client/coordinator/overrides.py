"""Configuration overrides of a running job, persisted next to its checkpoint records.

``PATCH .../checkpoints/configuration`` (see :mod:`.rest`) changes the
checkpoint interval (the query's trigger), the checkpoint timeout and the
materialization interval of the running job.
The values are kept in ``config-overrides.json`` of the operator in the job's
metadata store (milliseconds, by their REST names; see
:class:`~dstl_client.coordinator.config.CoordinatorConfig` for the layout),
replaced atomically on every update, so a restarted driver, on this machine
or another, applies them again.
"""

from __future__ import annotations

import dataclasses
import json
import threading

from dstl_client.checkpoint.codec import shown
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.metadata import CorruptMetadata, MetadataStore
from dstl_client.core.errors import ConfigError, DstlError

INTERVAL = "checkpointInterval"
TIMEOUT = "checkpointTimeout"
MATERIALIZATION = "materializationInterval"
FIELDS = (INTERVAL, TIMEOUT, MATERIALIZATION)
#: the shortest checkpoint (trigger) interval: below it a micro-batch's fixed cost
#: (planning, two Spark jobs, the record) is most of the interval
MIN_INTERVAL_MS = 100
#: the largest value of every field (7 days, in milliseconds): a longer interval or
#: timeout is a mistake (a unit slip), and keeps every value far inside a float's range
MAX_OVERRIDE_MS = 7 * 24 * 3600 * 1000


class ConfigUpdateInProgress(DstlError):
    """Another configuration update of the job is running (HTTP 409)."""

    grpc_code = "ABORTED"
    kind = "config_update_in_progress"


def check_override(name: str, value: object) -> None:
    """:class:`ConfigError` unless ``value`` is a positive integer (milliseconds) in range.

    The range is 1 (:data:`MIN_INTERVAL_MS` for ``checkpointInterval``) to
    :data:`MAX_OVERRIDE_MS`; ``null`` is refused like any other non-integer.
    """
    if value is None:
        raise ConfigError(f"{name} must be a positive integer (milliseconds), not null")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer (milliseconds)")
    if name == INTERVAL and value < MIN_INTERVAL_MS:
        raise ConfigError(f"{name} must be at least {MIN_INTERVAL_MS} ms")
    if value > MAX_OVERRIDE_MS:
        raise ConfigError(f"{name} must be at most {MAX_OVERRIDE_MS} ms (7 days)")


def apply_overrides(config: CoordinatorConfig, overrides: dict[str, int]) -> CoordinatorConfig:
    """``config`` with the overrides applied (validated)."""
    if INTERVAL in overrides:
        config = dataclasses.replace(config, checkpoint_interval_s=overrides[INTERVAL] / 1000)
    if TIMEOUT in overrides:
        config = dataclasses.replace(config, checkpoint_timeout_s=overrides[TIMEOUT] / 1000)
    if MATERIALIZATION in overrides:
        config = dataclasses.replace(
            config, materialize_interval_s=overrides[MATERIALIZATION] / 1000
        )
    config.validate()
    return config


class ConfigOverrides:
    """The persisted overrides of one operator's checkpoint configuration.

    Invariants: an update is written (atomically, with
    :meth:`~dstl_client.coordinator.metadata.MetadataStore.put`) before the caller applies
    it, so what runs is never ahead of what a restart would apply; one update
    runs at a time (``update_lock``, taken without waiting: a concurrent update
    gets :class:`ConfigUpdateInProgress`); only known fields are kept.

    Threads: any (REST handler threads, the driver); :meth:`update` is
    serialised by ``update_lock``, :meth:`read` takes no lock (the object is
    replaced atomically).
    """

    def __init__(self, store: MetadataStore, name: str) -> None:
        self.store = store
        self.name = name
        self.update_lock = threading.Lock()

    @property
    def location(self) -> str:
        """Where the overrides are kept (a path or URL, for messages and the REST endpoint)."""
        return self.store.describe(self.name)

    def read(self) -> dict[str, int]:
        """The stored overrides (``{}`` when there are none).

        A file that does not decode, or a known field whose value
        :func:`check_override` refuses, raises
        :class:`~.metadata.CorruptMetadata` naming the file and the field
        (unknown fields are ignored: a newer writer's).
        """
        data = self.store.get(self.name)
        if data is None:
            return {}
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise CorruptMetadata(f"{self.location}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise CorruptMetadata(f"{self.location}: not a JSON object")
        out: dict[str, int] = {}
        for k, v in doc.items():
            if k not in FIELDS:
                continue
            try:
                check_override(k, v)
            except ConfigError as exc:
                raise CorruptMetadata(f"{self.location}: {exc.message}, not {shown(v)}") from None
            out[k] = v
        return out

    def update(
        self, config: CoordinatorConfig, changes: dict[str, int]
    ) -> tuple[CoordinatorConfig, dict[str, int]]:
        """Persist ``changes`` over the stored overrides; the config they make, and them.

        The caller holds ``update_lock``. Raises :class:`ConfigError` for
        invalid values, before anything is written.
        """
        for name, value in changes.items():
            if name not in FIELDS:
                raise ConfigError(f"unknown configuration field {name!r}")
            check_override(name, value)
        overrides = {**self.read(), **changes}
        new = apply_overrides(config, overrides)
        self.store.put(self.name, json.dumps(overrides).encode())
        return new, overrides
