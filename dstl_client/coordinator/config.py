"""Configuration of a keyed operator's checkpoints: the defaults, defined here only.

:class:`CheckpointSettings` holds every tunable with its default;
:class:`CoordinatorConfig` adds what identifies one operator's checkpoints
(job id, checkpoint directory) and the Spark integration's
:class:`~dstl_client.batch.options.KeyedOptions` adds the query's own options:
both inherit the defaults instead of repeating them.

The job's checkpoint metadata is a :class:`~.metadata.MetadataStore` at
``metadata_url`` (a path, ``file:///...`` or ``s3://bucket/prefix``; see
:func:`metadata_location` for the default, ``<checkpoint_dir>/dstl``). Names
in it, the same on every kind of store::

    checkpoints/ck-<batch, 12 digits>.json            records of operator "keyed" (the default)
    config-overrides.json                             its REST overrides
    operators/<operator>/checkpoints/ck-<batch>.json  the same for any other operator
    operators/<operator>/config-overrides.json
    <records prefix>superseded/ck-<batch>.json        records a restore moved aside (see
                                                      :mod:`.rollback`), kept until the new
                                                      run records that batch
    <operator prefix>restore.json                     the last restore (``restore_from``)

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
from urllib.parse import urlsplit

from dstl_client.checkpoint.messages import DEFAULT_CACHE_ROWS
from dstl_client.connect import find_address, find_token
from dstl_client.coordinator.cleanup import DEFAULT_GRACE_S
from dstl_client.coordinator.metadata import (
    SUPPORTED,
    MetadataStore,
    check_metadata_url,
    open_metadata_store,
)
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.core.keys import check_job_id
from dstl_client.keygroups import DEFAULT_MAX_PARALLELISM, check_parallelism

#: the operator id of a query with one keyed operator (its files keep the original layout)
DEFAULT_OPERATOR = "keyed"
_OPERATOR_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: the folder of the job's checkpoint metadata in a checkpoint directory (by default)
METADATA_FOLDER = "dstl"
RECORDS = "checkpoints/"
OVERRIDES = "config-overrides.json"
OPERATORS = "operators/"
#: records a restore moved aside, under the records prefix (see :mod:`.rollback`)
SUPERSEDED = "superseded/"
#: the last restore of an operator, under its prefix
RESTORE_MARKER = "restore.json"
_OTHER_RECORD = re.compile(r"^operators/([^/]+)/checkpoints/[^/]+$")
#: a URL's scheme, as Spark (Hadoop's ``Path``) reads one: ``file:/x`` is a URL too
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def url_scheme(location: str) -> str:
    """The scheme of a URL (``s3a``, ``file``...), lowercase; ``""`` for a plain path."""
    m = _URL.match(location)
    return m.group(1).lower() if m else ""


def join_location(base: str, name: str) -> str:
    """``base/name``: a URL stays a URL (never through :class:`Path`), a path is joined."""
    if url_scheme(base):
        return f"{base.rstrip('/')}/{name}"
    return str(Path(base) / name)


def metadata_location(checkpoint_dir: str, metadata_url: str = "") -> str:
    """Where the job's checkpoint metadata is: ``metadata_url``, else beside ``checkpoint_dir``.

    The default is ``<checkpoint_dir>/dstl``: a path or ``file://`` URL stays
    local; ``s3a://b/ck`` and ``s3://b/ck`` become ``s3://b/ck/dstl`` (the same
    bucket and keys). Raises :class:`ConfigError` for a checkpoint directory
    elsewhere (``gs://``, ``hdfs://``...) without ``metadata_url``, and for
    an unsupported URL.
    """
    if metadata_url:
        location = metadata_url
    else:
        scheme = url_scheme(checkpoint_dir)
        if scheme in ("s3", "s3a"):
            parts = urlsplit(checkpoint_dir)
            location = f"s3://{parts.netloc}{parts.path.rstrip('/')}/{METADATA_FOLDER}"
        elif scheme in ("", "file"):
            location = join_location(checkpoint_dir, METADATA_FOLDER)
        else:
            raise ConfigError(
                f"checkpoint_dir {checkpoint_dir!r} is on {scheme}://, where the job's "
                f"checkpoint metadata cannot go: set metadata_url ({SUPPORTED})"
            )
    check_metadata_url(location)
    return location


def spark_location(checkpoint_dir: str, operator_id: str = DEFAULT_OPERATOR) -> str:
    """Spark's ``checkpointLocation`` of a keyed operator's query: ``spark`` or ``spark-<op>``."""
    name = "spark" if operator_id == DEFAULT_OPERATOR else f"spark-{operator_id}"
    return join_location(checkpoint_dir, name)


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
    #: start a materialization (a background snapshot of the changed key groups) this often
    materialize_interval_s: float = 30.0
    #: also start a materialization as soon as the changelog a restore would replay
    #: (stored bytes of the record's segments) exceeds this fraction of the
    #: materialized state (stored bytes of its parts): bounds restore time whatever
    #: the update rate, at the cost of uploading the state more often (0: by time
    #: only; the default, chosen from the curve of ``make bench-recovery`` in
    #: docs/benchmarks.md, keeps a restore within 1.2x a full snapshot's)
    materialize_tail_ratio: float = 0.1
    #: the tail ratio starts a materialization only once that changelog is at least
    #: this many stored bytes: a smaller tail costs a restore little, and materializing
    #: a small state every few batches would only add requests (0: any tail)
    materialize_tail_min_bytes: int = 1 << 20
    #: a materialization runs in the background across batches; a task that started one
    #: waits this long for it before leaving it running (0: it never holds a batch)
    materialization_wait_s: float = 0.0
    #: a materialization not finished in every subtask this long after it started fails
    materialization_timeout_s: float = 600.0
    #: materializations failing in a row before the query fails
    max_materialization_failures: int = 3
    #: baseline mode: snapshot every key group at every materialization
    full_snapshot: bool = False
    #: node-local state stores (default :func:`default_state_dir`)
    state_dir: str = ""
    #: the driver's sidecar (default ``$DSTL_ADDRESS``); tasks prefer ``$DSTL_ADDRESS`` of their node
    dstl_address: str = ""
    #: the job's token at the sidecar (default ``$DSTL_TOKEN``)
    dstl_token: str | None = None
    #: how long a task waits for the sidecar to make its batch's changes durable
    persist_timeout_s: float = 120.0
    #: a batch's checkpoint (plan to record) taking longer is aborted
    checkpoint_timeout_s: float = 600.0
    #: the query's trigger interval: one checkpoint per micro-batch (0: as fast as
    #: Spark can; a ``trigger`` option, e.g. ``{"processingTime": "5 seconds"}``, sets it too)
    checkpoint_interval_s: float = 0.0
    #: consecutive failed checkpoints (timed out, incomplete, record not written) run again
    #: before the query fails (Flink's tolerable-failed-checkpoints)
    tolerable_failed_checkpoints: int = 3
    #: the start-up orphan sweep leaves unreferenced objects younger than this
    orphan_grace_s: float = DEFAULT_GRACE_S
    #: rows of each task's node-local store kept decoded in memory
    cache_rows: int = DEFAULT_CACHE_ROWS
    #: fsync the node-local stores and local metadata files (keep on)
    fsync: bool = True
    #: the job's checkpoint metadata: a path, ``file:///...`` or ``s3://bucket/prefix``
    #: (default: see :func:`metadata_location`)
    metadata_url: str = ""
    #: S3 endpoint of the metadata store (default: boto3's, e.g. ``$AWS_ENDPOINT_URL``)
    metadata_s3_endpoint_url: str = ""
    #: S3 region of the metadata store (default: boto3's, e.g. ``$AWS_REGION``)
    metadata_s3_region: str = ""
    #: start from this retained checkpoint instead of the latest (like Flink's ``-s``):
    #: newer records and Spark's progress past it are moved aside, once per batch id
    #: (see :mod:`.rollback`); ``None``: resume from the latest
    restore_from: int | None = None
    #: on ``DstlQuery.stop(cancel=True)``, keep the checkpoints (Flink's RETAIN_ON_CANCELLATION,
    #: the default) or dispose of them (False: DELETE_ON_CANCELLATION)
    retain_on_cancel: bool = True

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
        if not 0 <= self.materialize_tail_ratio < float("inf"):
            raise ConfigError("materialize_tail_ratio must be a finite number >= 0")
        if self.materialize_tail_min_bytes < 0:
            raise ConfigError("materialize_tail_min_bytes must be >= 0")
        if not 0 <= self.checkpoint_interval_s < float("inf"):
            raise ConfigError("checkpoint_interval_s must be a finite number >= 0")
        if self.tolerable_failed_checkpoints < 0:
            raise ConfigError("tolerable_failed_checkpoints must be >= 0")
        if not 0 <= self.materialization_wait_s < float("inf"):
            raise ConfigError("materialization_wait_s must be a finite number >= 0")
        if not self.materialization_timeout_s > 0:
            raise ConfigError("materialization_timeout_s must be > 0")
        if self.max_materialization_failures < 1:
            raise ConfigError("max_materialization_failures must be >= 1")
        if self.persist_timeout_s <= 0:
            raise ConfigError("persist_timeout_s must be > 0")
        if self.checkpoint_timeout_s <= 0:
            raise ConfigError("checkpoint_timeout_s must be > 0")
        if not self.orphan_grace_s >= 0:
            raise ConfigError("orphan_grace_s must be >= 0")
        if self.metadata_url:
            check_metadata_url(self.metadata_url)
        if self.restore_from is not None and (
            isinstance(self.restore_from, bool)
            or not isinstance(self.restore_from, int)
            or self.restore_from < 0
        ):
            raise ConfigError(f"restore_from={self.restore_from!r}: a batch id >= 0, or None")

    def settings(self) -> dict[str, Any]:
        """The values of :class:`CheckpointSettings`'s fields (for a subclass to pass on)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(CheckpointSettings)}


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorConfig(CheckpointSettings):
    """Configuration of one keyed operator's checkpoints."""

    #: the job's id at the sidecar; owns the object prefix ``<job_id>/`` alone
    job_id: str
    #: the query's checkpoint directory (a path or URL; the job's checkpoint
    #: metadata is at ``<checkpoint_dir>/dstl`` unless ``metadata_url`` says elsewhere)
    checkpoint_dir: str

    def validate(self) -> None:
        try:
            check_job_id(self.job_id)
        except InvalidArgument as exc:
            raise ConfigError(exc.message) from None
        if not self.checkpoint_dir:
            raise ConfigError("checkpoint_dir is required")
        self.validate_settings()
        metadata_location(self.checkpoint_dir, self.metadata_url)

    def resolved(self) -> CoordinatorConfig:
        """Unset state directory, sidecar address and token from their defaults."""
        cfg = self
        if not cfg.state_dir:
            cfg = dataclasses.replace(cfg, state_dir=default_state_dir())
        cfg = dataclasses.replace(
            cfg,
            dstl_address=find_address(cfg.dstl_address),
            dstl_token=find_token(cfg.dstl_token),
        )
        return cfg

    # ---------------------------------------------------------------- layout
    @property
    def metadata_location(self) -> str:
        """The URL (or path) of the job's checkpoint metadata (:func:`metadata_location`)."""
        return metadata_location(self.checkpoint_dir, self.metadata_url)

    def open_metadata(self) -> MetadataStore:
        """The job's metadata store (every keyed operator's records are in it)."""
        return open_metadata_store(
            self.metadata_location,
            s3_endpoint_url=self.metadata_s3_endpoint_url,
            s3_region=self.metadata_s3_region,
            fsync=self.fsync,
        )

    @property
    def operator_prefix(self) -> str:
        """This operator's names start with it (``""`` for the default operator)."""
        if self.operator_id == DEFAULT_OPERATOR:
            return ""
        return f"{OPERATORS}{self.operator_id}/"

    @property
    def records_prefix(self) -> str:
        return self.operator_prefix + RECORDS

    @property
    def overrides_name(self) -> str:
        return self.operator_prefix + OVERRIDES

    @property
    def superseded_prefix(self) -> str:
        """Records a restore moved aside (kept until the new run records their batch)."""
        return self.records_prefix + SUPERSEDED

    @property
    def restore_marker_name(self) -> str:
        return self.operator_prefix + RESTORE_MARKER

    @property
    def spark_checkpoint_dir(self) -> str:
        """Spark's ``checkpointLocation`` of this operator's query (:func:`spark_location`)."""
        return spark_location(self.checkpoint_dir, self.operator_id)

    def other_records_prefixes(self, store: MetadataStore) -> list[str]:
        """Records prefixes of the job's other keyed operators that have records in ``store``."""
        out: list[str] = []
        if self.operator_id != DEFAULT_OPERATOR and store.list(RECORDS):
            out.append(RECORDS)
        others = set()
        for name in store.list(OPERATORS):
            m = _OTHER_RECORD.match(name)
            if m and m.group(1) != self.operator_id:
                others.add(m.group(1))
        out.extend(f"{OPERATORS}{op}/{RECORDS}" for op in sorted(others))
        return out
