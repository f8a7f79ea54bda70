"""Where a retained checkpoint is: its record and the state schemas it names.

The first step of reading a checkpoint's state offline (see
:mod:`dstl_client.spark.state_reader`): find the job's metadata (a
``checkpoint_dir`` or a ``metadata_url``), the operator's records in it, and
the retained batch asked for. Every miss is a
:class:`~dstl_client.coordinator.storage.CheckpointMissing` naming what there
is instead. Pure functions of the metadata store; any thread may call them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.coordinator.config import (
    DEFAULT_OPERATOR,
    OPERATORS,
    RECORDS,
    metadata_location,
)
from dstl_client.coordinator.metadata import (
    MetadataStore,
    check_metadata_url,
    open_metadata_store,
)
from dstl_client.coordinator.state_schemas import OperatorSchemas, load_schemas
from dstl_client.coordinator.storage import CheckpointMissing, CheckpointStorage
from dstl_client.core.errors import ConfigError

__all__ = ["CheckpointState", "load_checkpoint", "load_state", "retained_checkpoints"]


def _records_prefixes(store: MetadataStore) -> dict[str, str]:
    """``{operator id: records prefix}`` of every operator with a record in ``store``."""
    out: dict[str, str] = {}
    if CheckpointStorage(store, RECORDS).batch_ids():
        out[DEFAULT_OPERATOR] = RECORDS
    for name in store.list(OPERATORS):
        parts = name.split("/")
        if len(parts) == 4 and parts[2] == RECORDS.rstrip("/") and parts[1] not in out:
            prefix = f"{OPERATORS}{parts[1]}/{RECORDS}"
            if CheckpointStorage(store, prefix).batch_ids():
                out[parts[1]] = prefix
    return out


def _location(checkpoint_dir: str | None, metadata_url: str | None) -> str:
    if not checkpoint_dir and not metadata_url:
        raise ConfigError(
            "where is the checkpoint? give checkpoint_dir (the query's checkpointLocation) "
            "or metadata_url (its job metadata)"
        )
    return metadata_location(checkpoint_dir or "", metadata_url or "")


def retained_checkpoints(
    *,
    checkpoint_dir: str | None = None,
    metadata_url: str | None = None,
    metadata_s3_endpoint_url: str = "",
    metadata_s3_region: str = "",
) -> dict[str, list[int]]:
    """``{operator id: retained batch ids, ascending}`` of the job at that location."""
    location = _location(checkpoint_dir, metadata_url)
    kind, path, _ = check_metadata_url(location)
    if kind == "file" and not Path(path).is_dir():
        return {}  # opening a file store would create the directory
    store = open_metadata_store(
        location, s3_endpoint_url=metadata_s3_endpoint_url, s3_region=metadata_s3_region
    )
    try:
        return {
            op: CheckpointStorage(store, prefix).batch_ids()
            for op, prefix in sorted(_records_prefixes(store).items())
        }
    finally:
        store.close()


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """A retained checkpoint's record and the state schemas it names (``None``: none recorded)."""

    record: CheckpointRecord
    schemas: OperatorSchemas | None


def load_checkpoint(
    *,
    checkpoint_dir: str | None = None,
    metadata_url: str | None = None,
    operator_id: str = DEFAULT_OPERATOR,
    batch_id: int | None = None,
    metadata_s3_endpoint_url: str = "",
    metadata_s3_region: str = "",
) -> CheckpointRecord:
    """The record of one retained checkpoint (``batch_id=None``: the latest).

    Raises :class:`CheckpointMissing` naming what is there instead.
    """
    return load_state(
        checkpoint_dir=checkpoint_dir,
        metadata_url=metadata_url,
        operator_id=operator_id,
        batch_id=batch_id,
        metadata_s3_endpoint_url=metadata_s3_endpoint_url,
        metadata_s3_region=metadata_s3_region,
    ).record


def load_state(
    *,
    checkpoint_dir: str | None = None,
    metadata_url: str | None = None,
    operator_id: str = DEFAULT_OPERATOR,
    batch_id: int | None = None,
    metadata_s3_endpoint_url: str = "",
    metadata_s3_region: str = "",
) -> CheckpointState:
    """:func:`load_checkpoint`, with the state schema document its record names."""
    location = _location(checkpoint_dir, metadata_url)
    kind, path, _ = check_metadata_url(location)
    if kind == "file" and not Path(path).is_dir():
        raise CheckpointMissing(
            f"no checkpoint records at {location}: no such directory (is it the query's "
            "checkpointLocation, or its metadata_url?)"
        )
    store = open_metadata_store(
        location, s3_endpoint_url=metadata_s3_endpoint_url, s3_region=metadata_s3_region
    )
    try:
        prefixes = _records_prefixes(store)
        if not prefixes:
            raise CheckpointMissing(
                f"no checkpoint records at {store.url} (looked for {RECORDS}ck-*.json and "
                f"{OPERATORS}<operator>/{RECORDS}ck-*.json)"
            )
        if operator_id not in prefixes:
            raise CheckpointMissing(
                f"no checkpoints of operator {operator_id!r} at {store.url}: the job's keyed "
                f"operators are {', '.join(repr(op) for op in sorted(prefixes))}"
            )
        storage = CheckpointStorage(store, prefixes[operator_id])
        retained = storage.batch_ids()
        if batch_id is None:
            batch_id = retained[-1]
        elif batch_id not in retained:
            raise CheckpointMissing(
                f"no retained checkpoint of batch {batch_id} for operator {operator_id!r} at "
                f"{store.url}: the retained ones are batches "
                f"{', '.join(str(b) for b in retained)} (older checkpoints are dropped with "
                "their objects, see retain)"
            )
        record = storage.load(batch_id)
        schemas = (
            None
            if record.state_schema is None
            else load_schemas(store, prefixes[operator_id], record.state_schema)
        )
        return CheckpointState(record, schemas)
    finally:
        store.close()
