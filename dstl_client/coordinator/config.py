"""Configuration of a keyed operator's checkpoints: the defaults, defined here only.

:class:`CheckpointSettings` holds every tunable with its default;
:class:`CoordinatorConfig` adds what identifies one operator's checkpoints
(job id, checkpoint directory) and the Spark integration's
:class:`~dstl_client.spark.options.KeyedOptions` adds the query's own options:
both inherit the defaults instead of repeating them.

Layout under a query's ``checkpoint_dir`` (the job's checkpoint metadata is
``<checkpoint_dir>/dstl``)::

    dstl/checkpoints/ck-<batch>.json              records of operator "keyed" (the default)
    dstl/config-overrides.json                    its REST overrides
    dstl/operators/<operator>/checkpoints/...     the same for any other operator
    dstl/operators/<operator>/config-overrides.json

Frozen values: safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstl_client.coordinator.cleanup import DEFAULT_GRACE_S
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.core.keys import check_job_id
from dstl_client.keygroups import DEFAULT_MAX_PARALLELISM, check_parallelism
from dstl_client.state.backend import DEFAULT_CACHE_ROWS
from dstl_client.state.clients import ADDRESS_ENV, TOKEN_ENV

#: the operator id of a query with one keyed operator (its files keep the original layout)
DEFAULT_OPERATOR = "keyed"
_OPERATOR_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def default_state_dir() -> str:
    """Node-local state directory: ``$DSTL_STATE_DIR`` or ``<tmp>/dstl-state``."""
    return os.environ.get("DSTL_STATE_DIR") or str(Path(tempfile.gettempdir()) / "dstl-state")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSettings:
    """The tunables of one keyed operator's checkpoints and their defaults."""

    #: names the operator among the keyed operators of the job (a path component)
    operator_id: str = DEFAULT_OPERATOR
    #: the number of key groups; fixed when a job is created
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    #: checkpoints kept (the newest); older ones are dropped with their objects
    retain: int = 2
    materialize_interval_s: float = 30.0
    max_materialization_failures: int = 3
    #: baseline mode: snapshot every key group at every materialization
    full_snapshot: bool = False
    #: node-local state stores (default :func:`default_state_dir`)
    state_dir: str = ""
    #: the driver's sidecar (default ``$DSTL_ADDRESS``); tasks prefer ``$DSTL_ADDRESS`` of their node
    dstl_address: str = ""
    #: the job's token at the sidecar (default ``$DSTL_TOKEN``)
    dstl_token: str | None = None
    persist_timeout_s: float = 120.0
    #: a batch's checkpoint (plan to record) taking longer is aborted
    checkpoint_timeout_s: float = 600.0
    #: the start-up orphan sweep leaves unreferenced objects younger than this
    orphan_grace_s: float = DEFAULT_GRACE_S
    cache_rows: int = DEFAULT_CACHE_ROWS
    fsync: bool = True

    def validate_settings(self) -> None:
        if not _OPERATOR_ID.fullmatch(self.operator_id):
            raise ConfigError(
                f"bad operator id {self.operator_id[:140]!r}: 1-128 characters of letters, "
                "digits, '.', '_', '-'"
            )
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
        if not self.orphan_grace_s >= 0:
            raise ConfigError("orphan_grace_s must be >= 0")

    def settings(self) -> dict[str, Any]:
        """The values of :class:`CheckpointSettings`'s fields (for a subclass to pass on)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(CheckpointSettings)}


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorConfig(CheckpointSettings):
    """Configuration of one keyed operator's checkpoints."""

    #: the job's id at the sidecar; owns the object prefix ``<job_id>/`` alone
    job_id: str
    #: the query's checkpoint directory (records under ``<checkpoint_dir>/dstl``)
    checkpoint_dir: str

    def validate(self) -> None:
        try:
            check_job_id(self.job_id)
        except InvalidArgument as exc:
            raise ConfigError(exc.message) from None
        if not self.checkpoint_dir:
            raise ConfigError("checkpoint_dir is required")
        self.validate_settings()

    def resolved(self) -> CoordinatorConfig:
        """Unset state directory, sidecar address and token from their defaults."""
        cfg = self
        if not cfg.state_dir:
            cfg = dataclasses.replace(cfg, state_dir=default_state_dir())
        if not cfg.dstl_address:
            cfg = dataclasses.replace(cfg, dstl_address=os.environ.get(ADDRESS_ENV, ""))
        if cfg.dstl_token is None and os.environ.get(TOKEN_ENV):
            cfg = dataclasses.replace(cfg, dstl_token=os.environ[TOKEN_ENV])
        return cfg

    # ---------------------------------------------------------------- layout
    @property
    def metadata_dir(self) -> Path:
        """The job's checkpoint metadata: every keyed operator's records are below it."""
        return Path(self.checkpoint_dir) / "dstl"

    @property
    def operator_dir(self) -> Path:
        if self.operator_id == DEFAULT_OPERATOR:
            return self.metadata_dir
        return self.metadata_dir / "operators" / self.operator_id

    @property
    def records_dir(self) -> Path:
        return self.operator_dir / "checkpoints"

    @property
    def overrides_path(self) -> Path:
        return self.operator_dir / "config-overrides.json"

    def other_records_dirs(self) -> list[Path]:
        """Records directories of the job's other keyed operators present on disk."""
        out: list[Path] = []
        default = self.metadata_dir / "checkpoints"
        if self.operator_id != DEFAULT_OPERATOR and default.is_dir():
            out.append(default)
        operators = self.metadata_dir / "operators"
        if operators.is_dir():
            for child in sorted(operators.iterdir()):
                records = child / "checkpoints"
                if child.name != self.operator_id and records.is_dir():
                    out.append(records)
        return out
