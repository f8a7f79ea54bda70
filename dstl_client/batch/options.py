"""The options of a keyed query: one frozen object, defaults inherited, never repeated.

:class:`KeyedOptions` extends
:class:`~dstl_client.coordinator.config.CheckpointSettings` (every checkpoint
tunable and its default) with the query's own options, and builds the
coordinator's :class:`~dstl_client.coordinator.config.CoordinatorConfig`
from itself. ``process_keyed(..., parallelism=2, checkpoint_dir=...)`` maps
its keyword arguments onto these fields (:meth:`KeyedOptions.of`).

``checkpoint_dir`` may be a path or a URL Spark understands (``s3a://b/ck``
needs Hadoop's S3A jars on the classpath): it is never turned into a
:class:`~pathlib.Path`, so a URL reaches Spark's ``checkpointLocation`` as
written. The job's checkpoint metadata goes to ``metadata_url`` (default
``<checkpoint_dir>/dstl``, ``s3a://`` read as ``s3://``; see
:func:`~dstl_client.coordinator.config.metadata_location`).

``restore_from=N`` starts the query from the retained checkpoint of batch
``N`` instead of the latest (records and Spark progress past it moved aside,
see :mod:`dstl_client.coordinator.rollback`; the same as ``dstl checkpoints
restore N`` before the start). ``retain_on_cancel=False`` disposes of the
checkpoints on ``DstlQuery.stop(cancel=True)``.

Frozen: safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dstl_client.coordinator.config import (
    CheckpointSettings,
    CoordinatorConfig,
    metadata_location,
    spark_location,
    url_scheme,
)
from dstl_client.core.durations import parse_duration
from dstl_client.core.errors import ConfigError
from dstl_client.keygroups import check_parallelism
from dstl_client.keywords import check_keywords

#: keywords of earlier versions, and what became of them
_REMOVED = {
    "storage_url": "orphans are swept through the sidecar (see orphan_grace_s)",
    "lister": "orphans are swept through the sidecar (see orphan_grace_s)",
}


def default_job_id(checkpoint_dir: str) -> str:
    """A job id derived from the checkpoint directory (stable across restarts).

    A path (or ``file://`` URL) is made absolute with symlinks resolved; any
    other URL is taken as written (``s3a://`` and ``s3n://`` as ``s3://``,
    the same bucket and keys), never resolved as a local path.
    """
    scheme = url_scheme(checkpoint_dir)
    if scheme in ("", "file"):
        local = urlsplit(checkpoint_dir).path if scheme else checkpoint_dir
        where = str(Path(local).resolve())
    else:
        rest = checkpoint_dir.split(":", 1)[1].rstrip("/")
        where = f"{'s3' if scheme in ('s3a', 's3n') else scheme}:{rest}"
    name = where.rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"[^A-Za-z0-9._-]", "-", name).strip("-.") or "job"
    return f"{base[:100]}-{zlib.crc32(where.encode()):08x}"


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyedOptions(CheckpointSettings):
    """How a keyed query runs (the checkpoint tunables are inherited, with their defaults)."""

    #: Spark's checkpoint (``spark/``) and, unless ``metadata_url`` is set, the
    #: job's checkpoint metadata (``dstl/``); a path or a URL (``s3a://...``)
    checkpoint_dir: str
    #: subtasks of the operator; may change between runs (up to ``max_parallelism``)
    parallelism: int
    #: the job's id at the sidecar (default: derived from ``checkpoint_dir``)
    job_id: str | None = None
    #: ``DataStreamWriter.trigger`` keywords, e.g. ``{"processingTime": "5 seconds"}``
    trigger: Mapping[str, Any] | None = None
    #: the streaming query's name (``DataStreamWriter.queryName``; also the memory sink's view)
    query_name: str | None = None
    #: Prometheus metrics of the coordinator on this port (0: any free one)
    metrics_port: int | None = None
    #: the host the metrics endpoint binds: ``0.0.0.0`` to be scraped from outside the
    #: driver's pod (``/metrics`` holds figures only, no data and no secrets)
    metrics_host: str = "127.0.0.1"
    #: the dynamic configuration REST endpoint on this port (0: any free one)
    config_port: int | None = None
    #: the host the REST endpoint binds (anything but loopback needs ``config_token``)
    config_host: str = "127.0.0.1"
    #: the bearer token the REST endpoint requires (default: none, on loopback only)
    config_token: str = ""
    #: start the streaming query (else only the coordinator is started)
    start: bool = True
    #: ``on_phase(phase, batch_id)`` on the driver: "planned", "tasks_done", "recorded"
    on_phase: Callable[[str, int], None] | None = None

    @classmethod
    def of(cls, config: KeyedOptions | None, keywords: Mapping[str, Any]) -> KeyedOptions:
        """``config`` (if any) with ``keywords`` applied to its fields.

        Raises :class:`TypeError` naming an unknown keyword. ``None`` for a
        text setting whose default is ``""`` means the default.
        """
        check_keywords("process_keyed", keywords, cls, hints=_REMOVED)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {
            k: ("" if v is None and defaults.get(k) == "" else v) for k, v in keywords.items()
        }
        if config is not None:
            return dataclasses.replace(config, **values)
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in values
        )
        if missing:
            raise TypeError(f"process_keyed() needs the options {missing}")
        return cls(**values)

    def validate(self) -> None:
        if not self.checkpoint_dir:
            raise ConfigError("checkpoint_dir is required")
        check_parallelism(self.parallelism, self.max_parallelism)
        self.validate_settings()
        metadata_location(self.checkpoint_dir, self.metadata_url)

    def coordinator_config(self) -> CoordinatorConfig:
        settings = self.settings()
        processing_time = (self.trigger or {}).get("processingTime")
        if not self.checkpoint_interval_s and processing_time is not None:
            # the job's own processingTime trigger is its checkpoint interval (bare number: ms)
            interval = parse_duration(processing_time, bare_unit="ms", what="processingTime")
            settings["checkpoint_interval_s"] = interval.seconds
        return CoordinatorConfig(
            job_id=self.job_id or default_job_id(self.checkpoint_dir),
            checkpoint_dir=self.checkpoint_dir,
            **settings,
        )

    @property
    def spark_checkpoint_dir(self) -> str:
        """Spark's ``checkpointLocation`` of the query (one per keyed operator); a URL stays one."""
        return spark_location(self.checkpoint_dir, self.operator_id)


def stage_options(opts: KeyedOptions, operator_id: str, parallelism: int | None) -> KeyedOptions:
    """A chain stage's options: the chain's, with the stage's operator id and parallelism.

    The chain serves no metrics or REST port of its own per stage.
    """
    return dataclasses.replace(
        opts,
        operator_id=operator_id,
        parallelism=parallelism or opts.parallelism,
        metrics_port=None,
        config_port=None,
    )
