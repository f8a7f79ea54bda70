"""The rows of a retained checkpoint's state, read through a sidecar, no Spark needed.

:func:`iter_state_rows` finds the record (:mod:`.state_location`), then
restores the key groups asked for, :data:`RESTORE_KEY_GROUPS` at a time, into
a scratch SQLite store (the code path of a task's recovery,
:func:`~dstl_client.state.restore.restore_range`) and decodes each stored row
(:mod:`.state_decode`). A generator is used by one thread at a time; its
scratch stores are removed when it ends or is closed. User documentation:
:mod:`dstl_client.spark.state_reader`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.connect import ADDRESS_ENV, find_address, find_token, require_address
from dstl_client.coordinator.config import DEFAULT_OPERATOR
from dstl_client.coordinator.state_schemas import OperatorSchemas
from dstl_client.core.errors import InvalidArgument
from dstl_client.keygroups import KeyGroupRange
from dstl_client.spark.state_decode import (
    Decoder,
    StateRow,
    StateSpec,
    check_specs,
    decoders,
    state_row,
)
from dstl_client.spark.state_location import load_state
from dstl_client.state.clients import shared_client
from dstl_client.state.restore import restore_range
from dstl_client.state.serializers import Serializer
from dstl_client.state.store import LocalKeyedStore

__all__ = [
    "RESTORE_KEY_GROUPS",
    "iter_record_rows",
    "iter_state_rows",
    "key_group_list",
    "reader_client",
    "sidecar_address",
]

#: key groups restored into one scratch store at a time (bounds its disk use)
RESTORE_KEY_GROUPS = 64


def key_group_list(key_groups: Iterable[int] | None, max_parallelism: int) -> list[int]:
    """The key groups asked for, sorted and checked (``None``: all of them)."""
    if key_groups is None:
        return list(range(max_parallelism))
    kgs = sorted(set(key_groups))
    bad = [kg for kg in kgs if not isinstance(kg, int) or not 0 <= kg < max_parallelism]
    if bad:
        raise InvalidArgument(
            f"key groups {bad[:10]} outside [0, {max_parallelism}) (the job's max_parallelism)"
        )
    return kgs


def _runs(kgs: Sequence[int], most: int) -> Iterator[KeyGroupRange]:
    """Contiguous ranges of sorted ``kgs``, each of at most ``most`` key groups."""
    i = 0
    while i < len(kgs):
        j = i
        while j + 1 < len(kgs) and kgs[j + 1] == kgs[j] + 1 and j + 1 - i < most:
            j += 1
        yield KeyGroupRange(kgs[i], kgs[j])
        i = j + 1


def iter_record_rows(
    record: CheckpointRecord,
    client: ChangelogClient,
    *,
    serializers: Mapping[str, Serializer[Any] | StateSpec] | None = None,
    key_groups: Iterable[int] | None = None,
    workdir: str | None = None,
    schemas: OperatorSchemas | None = None,
) -> Generator[StateRow, None, None]:
    """The rows of ``record``'s state, by key group then row key.

    States with a schema in ``schemas`` (the document the record names, see
    :func:`load_state`) decode by it, unless ``serializers`` names them.

    Arguments are checked now; the rows are read as the iterator is consumed:
    :data:`RESTORE_KEY_GROUPS` key groups at a time are restored into a
    scratch store under ``workdir`` (default: the temp directory), removed
    when the iterator ends or is closed.
    """
    specs = decoders(check_specs(serializers), schemas)
    kgs = key_group_list(key_groups, record.max_parallelism)
    return _rows(record, client, specs, kgs, workdir)


def _rows(
    record: CheckpointRecord,
    client: ChangelogClient,
    specs: Mapping[str, Decoder],
    kgs: Sequence[int],
    workdir: str | None,
) -> Generator[StateRow, None, None]:
    tmp = Path(tempfile.mkdtemp(prefix="dstl-state-reader-", dir=workdir))
    try:
        for i, rng in enumerate(_runs(kgs, RESTORE_KEY_GROUPS)):
            with LocalKeyedStore(tmp / str(i), rng) as store:
                restore_range(store, record, client)
                for kg in rng:
                    for k, v in store.rows_of_key_group(kg):
                        yield state_row(kg, k, v, specs)
            shutil.rmtree(tmp / str(i), ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_HOW = f"pass dstl_address or set {ADDRESS_ENV} (the state is read through a sidecar)"


def sidecar_address(address: str | None) -> str:
    """The sidecar the state is read through (:mod:`dstl_client.connect`'s precedence:
    ``address``, else ``$DSTL_ADDRESS``); a :class:`ConfigError` when there is none."""
    return require_address(find_address(address), _HOW)


def reader_client(address: str | None, token: str | None) -> ChangelogClient:
    """The process's shared client of that sidecar (token: given, else ``$DSTL_TOKEN``)."""
    return shared_client(sidecar_address(address), find_token(token))


def iter_state_rows(
    *,
    checkpoint_dir: str | None = None,
    metadata_url: str | None = None,
    operator_id: str = DEFAULT_OPERATOR,
    batch_id: int | None = None,
    dstl_address: str | None = None,
    dstl_token: str | None = None,
    serializers: Mapping[str, Serializer[Any] | StateSpec] | None = None,
    key_groups: Iterable[int] | None = None,
    metadata_s3_endpoint_url: str = "",
    metadata_s3_region: str = "",
    client: ChangelogClient | None = None,
    workdir: str | None = None,
) -> Generator[StateRow, None, None]:
    """The rows of a retained checkpoint's state (see :mod:`.state_reader`), no Spark needed.

    ``client``: a sidecar client to use (else the process's shared client of
    ``dstl_address``). The record is resolved, and errors raised, by this
    call; the rows are read as the iterator is consumed.
    """
    specs = check_specs(serializers)
    found = load_state(
        checkpoint_dir=checkpoint_dir,
        metadata_url=metadata_url,
        operator_id=operator_id,
        batch_id=batch_id,
        metadata_s3_endpoint_url=metadata_s3_endpoint_url,
        metadata_s3_region=metadata_s3_region,
    )
    return iter_record_rows(
        found.record,
        client or reader_client(dstl_address, dstl_token),
        serializers=specs,
        key_groups=key_groups,
        workdir=workdir,
        schemas=found.schemas,
    )
