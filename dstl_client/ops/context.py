"""What every ``dstl`` command starts from: the job's metadata store, records, sidecar.

Where the metadata is comes from ``--metadata-url``, else from
``--checkpoint-dir`` exactly as the driver derives it
(:func:`~dstl_client.coordinator.config.metadata_location`:
``<checkpoint_dir>/dstl``, ``s3a://b/ck`` read as ``s3://b/ck/dstl``). The
job id is ``--job-id``, else the one in the records, else the one the
driver derives from ``--checkpoint-dir``
(:func:`~dstl_client.batch.options.default_job_id`). Nothing is opened before a
command asks for it: ``dstl config`` with ``--job-id`` never touches the metadata.
The sidecar's token is read from ``--token-file``, else ``$DSTL_TOKEN``
(:mod:`dstl_client.ops.tokens`), never from a flag.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.connect import (
    ADDRESS_ENV,
    TOKEN_ENV,
    ca_file,
    find_address,
    require_address,
    root_certificates,
)
from dstl_client.coordinator.config import (
    DEFAULT_OPERATOR,
    SUPERSEDED,
    CoordinatorConfig,
    metadata_location,
)
from dstl_client.coordinator.lifecycle import job_operators
from dstl_client.coordinator.metadata import (
    MetadataStore,
    check_metadata_url,
    open_metadata_store,
)
from dstl_client.coordinator.storage import CheckpointMissing, CheckpointStorage
from dstl_client.core.errors import ConfigError
from dstl_client.ops.tokens import resolve_token

#: where ``dstl config`` finds the driver's REST endpoint by default
REST_URL_ENV = "DSTL_REST_URL"
RETAINED = "retained"
SUPERSEDED_STATUS = "superseded"


@dataclass(frozen=True, slots=True)
class Listed:
    """One record of the job, as the CLI lists it."""

    operator_id: str
    status: str
    record: CheckpointRecord


class JobContext:
    """The job's metadata store (opened lazily), its records and a sidecar client.

    Owns what it opens; :meth:`close` releases it. One command's thread.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.checkpoint_dir: str = args.checkpoint_dir or ""
        self._store: MetadataStore | None = None
        self._client: ChangelogClient | None = None

    # ------------------------------------------------------------ metadata
    @property
    def located(self) -> bool:
        """Whether the command line says where the job's metadata is."""
        return bool(self.checkpoint_dir or self.args.metadata_url)

    @property
    def location(self) -> str:
        """The metadata location (:class:`ConfigError` when the command line gives none)."""
        if not self.located:
            raise ConfigError(
                "where is the job? give --checkpoint-dir (the query's checkpoint_dir) or "
                "--metadata-url (its metadata_url)"
            )
        return metadata_location(self.checkpoint_dir, self.args.metadata_url or "")

    @property
    def store(self) -> MetadataStore:
        if self._store is None:
            kind, path, _ = check_metadata_url(self.location)
            if kind == "file" and not Path(path).is_dir():
                raise CheckpointMissing(
                    f"no job metadata at {self.location}: no such directory (is it the query's "
                    "checkpoint_dir, or its metadata_url?)"
                )
            self._store = open_metadata_store(
                self.location,
                s3_endpoint_url=self.args.metadata_s3_endpoint_url or "",
                s3_region=self.args.metadata_s3_region or "",
            )
        return self._store

    def operators(self) -> dict[str, str]:
        """``{operator id: records prefix}``: ``--operator-id`` only, if given."""
        found = job_operators(self.store)
        wanted = self.args.operator_id
        if wanted is None:
            return found
        if wanted not in found:
            raise CheckpointMissing(
                f"no checkpoints of operator {wanted!r} at {self.store.url}"
                + (
                    f": the job's keyed operators are {', '.join(map(repr, found))}"
                    if found
                    else ""
                )
            )
        return {wanted: found[wanted]}

    def operator(self) -> tuple[str, str]:
        """The one operator a command acts on: ``--operator-id``, else ``keyed``."""
        op = self.args.operator_id or DEFAULT_OPERATOR
        found = job_operators(self.store)
        if op not in found:
            raise CheckpointMissing(
                f"no checkpoints of operator {op!r} at {self.store.url}"
                + (
                    f": the job's keyed operators are {', '.join(map(repr, found))}"
                    if found
                    else ""
                )
            )
        return op, found[op]

    def records(self, *, superseded: bool = True) -> list[Listed]:
        """Every record of the selected operators (retained, then superseded), by batch."""
        out: list[Listed] = []
        for op, prefix in self.operators().items():
            kinds = [(RETAINED, prefix)]
            if superseded:
                kinds.append((SUPERSEDED_STATUS, prefix + SUPERSEDED))
            for status, pfx in kinds:
                storage = CheckpointStorage(self.store, pfx)
                for b in storage.batch_ids():
                    try:
                        out.append(Listed(op, status, storage.load(b)))
                    except CheckpointMissing:  # dropped meanwhile by a running driver
                        continue
        out.sort(key=lambda r: (r.operator_id, r.record.batch_id, r.status))
        return out

    def record(self, batch_id: int | None) -> CheckpointRecord:
        """A retained record of the operator (``None``: the latest)."""
        op, prefix = self.operator()
        storage = CheckpointStorage(self.store, prefix)
        retained = storage.batch_ids()
        if not retained:
            raise CheckpointMissing(
                f"no retained checkpoint of operator {op!r} at {self.store.url}"
            )
        if batch_id is None:
            batch_id = retained[-1]
        if batch_id not in retained:
            aside = CheckpointStorage(self.store, prefix + SUPERSEDED)
            if batch_id in aside.batch_ids():
                return aside.load(batch_id)
            raise CheckpointMissing(
                f"no retained checkpoint of batch {batch_id} for operator {op!r} at "
                f"{self.store.url}: the retained ones are batches "
                f"{', '.join(map(str, retained))}"
            )
        return storage.load(batch_id)

    # ---------------------------------------------------------------- job
    @property
    def job_id(self) -> str:
        if self.args.job_id:
            return str(self.args.job_id)
        if not self.located:
            raise ConfigError(
                "which job? give --job-id (the query's job_id), or --checkpoint-dir / "
                "--metadata-url to read it from the job's records"
            )
        try:
            for listed in self.records():
                return listed.record.job_id
        except CheckpointMissing:
            pass
        if self.checkpoint_dir:
            from dstl_client.batch.options import default_job_id

            return default_job_id(self.checkpoint_dir)
        raise ConfigError("no records to take the job id from: give --job-id")

    def config(self, operator_id: str) -> CoordinatorConfig:
        """The coordinator configuration of one operator, as far as the CLI knows it."""
        return CoordinatorConfig(
            job_id=self.job_id,
            checkpoint_dir=self.checkpoint_dir or self.location,
            operator_id=operator_id,
            metadata_url=self.args.metadata_url or "",
        )

    # ------------------------------------------------------------- sidecar
    @property
    def client(self) -> ChangelogClient:
        if self._client is None:
            address = require_address(
                find_address(self.args.address),
                f"give --address or set {ADDRESS_ENV} (objects are "
                "read, listed and discarded through a sidecar)",
            )
            # the CLI's secret rules (file, else variable; checked): the same precedence
            token = resolve_token(self.args.token_file, "--token-file", TOKEN_ENV)
            roots = root_certificates(ca_file())
            self._client = ChangelogClient(
                address, token=token, root_certificates=roots, timeout_s=self.args.timeout_s
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._store is not None:
            self._store.close()
            self._store = None
