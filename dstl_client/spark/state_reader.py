"""Read the state of a retained checkpoint: Python records, or a Spark DataFrame.

The counterpart of Spark's ``statestore`` data source
(``spark.read.format("statestore").load(checkpointLocation)``) for keyed
state on the DSTL. Offline: no query needs to run, but a sidecar must be
reachable, since the state objects are read through it
(:class:`~dstl_client.client.ChangelogClient`; no storage credentials)::

    from dstl_client.spark.state_reader import StateSpec, read_state

    df = read_state(
        spark,
        checkpoint_dir="/ckpt/clicks",       # the query's checkpointLocation
        dstl_address="localhost:7000",       # default: $DSTL_ADDRESS
        serializers={                        # optional, per state name
            "total": INT64,                  # a value (or reducing) state
            "recent": StateSpec.list_state(INT64),
            "pages": StateSpec.map_state(STR, INT64),
        },
    )
    df.where("state_name = 'pages'").show()

:func:`read_state` (a DataFrame) and :func:`iter_state_rows` (a generator of
:class:`StateRow`, no Spark needed) take the same arguments:

* where: ``checkpoint_dir`` (the job's metadata is at ``<checkpoint_dir>/dstl``)
  or ``metadata_url`` (a path, ``file:///...`` or ``s3://bucket/prefix``, as the
  query's ``metadata_url``; S3 credentials from boto3's default chain, endpoint
  and region overridable), ``operator_id`` (default ``"keyed"``) and
  ``batch_id`` (default: the latest retained checkpoint).
* the sidecar: ``dstl_address`` / ``dstl_token`` (default ``$DSTL_ADDRESS`` /
  ``$DSTL_TOKEN``; ``$DSTL_CA_FILE`` turns on TLS, as for tasks).
* ``serializers``: per state name a
  :class:`~dstl_client.state.serializers.Serializer` (a value or reducing
  state, or the values of a map state) or a :class:`StateSpec` (the kind of
  state and its serializers). States not named decode by their recorded
  schema (a processor's states: :mod:`dstl_client.coordinator.state_schemas`,
  values as ``Row``\\ s, a TTL's expiry in ``StateRow.expiry_ms``), else keep
  raw bytes.
* ``key_groups``: only these key groups (default: all).
* ``state_name`` (:func:`read_state` only, Spark's ``stateVarName``): that
  state alone, as typed columns from its recorded schema
  (:func:`typed_schema`: ``key``, ``value`` / ``list_element`` /
  ``user_map_key`` and ``user_map_value``, ``partition_id``, ``key_group``,
  and ``expiration_ms`` with a TTL), as Spark's ``statestore`` source reads a
  ``transformWithState`` state variable.

**Rows** (every state at once). One per stored row of the checkpoint: one per key and value, list
or reducing state, one per key and *entry* of a map state. Columns (the
DataFrame's, and :class:`StateRow`'s fields):

==================  ========  ===================================================
``key_group``       int       the key's group
``key``             string    the key (its bytes as UTF-8; invalid bytes escaped)
``state_name``      string    the state's name
``state_kind``      string    ``value``, ``list``, ``map`` or ``reducing``; null
                              when unknown (see below)
``user_key``        string    a map entry's key, decoded, as JSON text; null for
                              other states or without a key serializer
``value``           string    the decoded value as JSON text (tuples and lists as
                              arrays, a list state's elements as an array,
                              ``Row``\\ s as objects, times as ISO text; what
                              JSON cannot hold as its ``repr``); null without a
                              serializer or recorded schema
``user_key_bytes``  binary    a map entry's key as stored
``value_bytes``     binary    the value as stored (a list's elements
                              length-prefixed, see :mod:`dstl_client.state.changes`)
==================  ========  ===================================================

A row key says which state and key it belongs to, and whether it is a map
entry, but not whether a single row is a value, a list or a reducing state
(they are stored alike): ``state_kind`` is ``"map"`` for map entries, the
kind a :class:`StateSpec` or the recorded schema names, ``"value"`` for a
bare serializer, and null for other states. A serializer that cannot decode a row, or a spec whose kind
contradicts the rows (a map spec for a single row, or the reverse), raises
:class:`~dstl_client.core.errors.InvalidArgument` naming the state, key and
key group. Decoded values are JSON text in the DataFrame because one column
cannot take every state's type: ``F.from_json("value", "array<long>")``
gives typed columns back; :class:`StateRow` holds the Python objects.

**Errors.** :class:`~dstl_client.coordinator.storage.CheckpointMissing`, with
what there is instead: no checkpoint records at the location, an operator the
job does not have (the known ones listed), a batch not retained (the retained
ones listed; older checkpoints were dropped with their objects). Raised by
:func:`read_state` in the caller's process, before Spark plans anything.

**How the DataFrame is built, and why.** :func:`read_state` resolves the
checkpoint record in the caller's process, then reads through a Python data
source (``dstl_state``, :class:`StateDataSource`): its partitions are slices of
the key groups; each Spark task restores its key groups from the sidecar into
a scratch SQLite store on the executor's disk (the code path of a task's
recovery, :func:`~dstl_client.state.restore.restore_range`) and streams them
out as Arrow batches of :data:`CHUNK_ROWS` rows. So no process holds more than
a chunk of rows in memory (nor a scratch store of more than
:data:`RESTORE_KEY_GROUPS` key groups on disk), the read is spread over the
executors, and nothing is left to clean up. Building it from driver-side
chunks (``createDataFrame`` and ``union``) keeps every row in the driver's
JVM; a temporary Parquet copy needs a location every executor can read and
someone to delete it. The price: the DataFrame is evaluated per action, each
re-reading from the sidecar, so ``.cache()`` it when it is queried more than
once, and a checkpoint dropped by a running query meanwhile (``retain``)
fails the next action. The executors reach the sidecar of their node
(``$DSTL_ADDRESS``) or else the given address, like the job's tasks.

The data source can be used directly too, like ``statestore``::

    spark.dataSource.register(StateDataSource)
    spark.read.format("dstl_state").option("batchId", 7).load("/ckpt/clicks")

(options ``metadataUrl``, ``operatorId``, ``batchId``, ``dstlAddress``,
``keyGroups`` (``"0-15,31"``), ``stateVarName``; the token from
``$DSTL_TOKEN``); recorded schemas decode, serializers cannot be given.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.connect import ADDRESS_ENV, find_address, find_token, require_address
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
from dstl_client.coordinator.state_schemas import OperatorSchemas, StateSchema, load_schemas
from dstl_client.coordinator.storage import CheckpointMissing, CheckpointStorage
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.extras import require_spark
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.changes import MAP_TAG, decode_state_key, iter_elements
from dstl_client.state.clients import STATE_DIR_ENV, shared_client
from dstl_client.state.restore import restore_range
from dstl_client.state.serializers import Serializer
from dstl_client.state.store import LocalKeyedStore

__all__ = [
    "CHUNK_ROWS",
    "FORMAT",
    "RESTORE_KEY_GROUPS",
    "SCHEMA_DDL",
    "CheckpointState",
    "StateRow",
    "StateSpec",
    "iter_record_rows",
    "iter_state_rows",
    "load_checkpoint",
    "load_state",
    "read_state",
    "retained_checkpoints",
]

#: the data source's short name (``spark.read.format(FORMAT)``)
FORMAT = "dstl_state"
#: rows per Arrow batch a Spark task sends
CHUNK_ROWS = 4096
#: key groups restored into one scratch store at a time (bounds its disk use)
RESTORE_KEY_GROUPS = 64
#: the DataFrame's columns
SCHEMA_DDL = (
    "key_group int, key string, state_name string, state_kind string, user_key string, "
    "value string, user_key_bytes binary, value_bytes binary"
)
KINDS = ("value", "list", "map", "reducing")


# ------------------------------------------------------------ what to decode


@dataclass(frozen=True, slots=True)
class StateSpec:
    """How one state is decoded: its kind and serializers (build with the class methods)."""

    kind: str
    serializer: Serializer[Any]
    #: a map state's key serializer
    key_serializer: Serializer[Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgument(f"unknown state kind {self.kind!r}: one of {', '.join(KINDS)}")
        if (self.kind == "map") != (self.key_serializer is not None):
            raise InvalidArgument("a key serializer is for map states, and a map state needs one")

    @classmethod
    def value_state(cls, serializer: Serializer[Any]) -> StateSpec:
        return cls("value", serializer)

    @classmethod
    def list_state(cls, serializer: Serializer[Any]) -> StateSpec:
        """A list state: ``serializer`` decodes each element."""
        return cls("list", serializer)

    @classmethod
    def map_state(
        cls, key_serializer: Serializer[Any], value_serializer: Serializer[Any]
    ) -> StateSpec:
        return cls("map", value_serializer, key_serializer)

    @classmethod
    def reducing_state(cls, serializer: Serializer[Any]) -> StateSpec:
        return cls("reducing", serializer)


def _specs(
    serializers: Mapping[str, Serializer[Any] | StateSpec] | None,
) -> dict[str, StateSpec | Serializer[Any]]:
    out: dict[str, StateSpec | Serializer[Any]] = {}
    for name, s in (serializers or {}).items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(
                f"serializers: a state name must be a non-empty str, not {name!r}"
            )
        if not isinstance(s, StateSpec) and not callable(getattr(s, "loads", None)):
            raise InvalidArgument(
                f"serializers[{name!r}]: {s!r} is neither a Serializer (with loads) nor a StateSpec"
            )
        out[name] = s
    return out


@dataclass(frozen=True, slots=True)
class _Recorded:
    """How a state with a recorded schema is decoded: its codecs (built from the schema)."""

    schema: StateSchema
    value_codec: Any
    key_codec: Any = None

    @classmethod
    def of(cls, schema: StateSchema) -> _Recorded:
        from dstl_client.processor.codec import RowCodec

        def codec(text: str) -> Any:
            from pyspark.sql.types import StructType

            return RowCodec(StructType.fromJson(json.loads(text)))

        key = None if schema.key_schema is None else codec(schema.key_schema)
        return cls(schema, codec(schema.value_schema), key)


def _decoders(
    specs: Mapping[str, StateSpec | Serializer[Any]], schemas: OperatorSchemas | None
) -> dict[str, StateSpec | Serializer[Any] | _Recorded]:
    """Per state name: the serializers given, else the recorded schema's codecs."""
    out: dict[str, StateSpec | Serializer[Any] | _Recorded] = {}
    if schemas is not None:
        if any(s.name not in specs for s in schemas.states):
            require_spark("decoding states by their recorded schemas")
        for state in schemas.states:
            if state.name not in specs:
                out[state.name] = _Recorded.of(state)
    out.update(specs)
    return out


# ------------------------------------------------------------------- rows


@dataclass(frozen=True, slots=True)
class StateRow:
    """One stored row of a checkpoint's state, decoded as far as the serializers given allow."""

    key_group: int
    #: the key's bytes as UTF-8 (invalid bytes backslash-escaped)
    key: str
    state_name: str
    #: ``value``, ``list``, ``map``, ``reducing``; ``None`` when the rows cannot tell
    state_kind: str | None
    #: a map entry's key: decoded, or its bytes without a key serializer; ``None`` otherwise
    user_key: Any
    #: decoded (a list state's elements as a list), or the stored bytes without a serializer
    value: Any
    key_bytes: bytes
    user_key_bytes: bytes | None
    value_bytes: bytes
    user_key_decoded: bool = False
    value_decoded: bool = False
    #: a state with a TTL (decoded by its recorded schema): the value's expiry in ms
    #: (a list state's: one per element); ``None`` otherwise
    expiry_ms: Any = None

    @property
    def user_key_json(self) -> str | None:
        """The decoded map key as JSON text (the DataFrame's ``user_key``)."""
        return _json_text(self.user_key) if self.user_key_decoded else None

    @property
    def value_json(self) -> str | None:
        """The decoded value as JSON text (the DataFrame's ``value``)."""
        return _json_text(self.value) if self.value_decoded else None

    def as_tuple(self) -> tuple[Any, ...]:
        """The DataFrame's columns, in :data:`SCHEMA_DDL` order."""
        return (
            self.key_group,
            self.key,
            self.state_name,
            self.state_kind,
            self.user_key_json,
            self.value_json,
            self.user_key_bytes,
            self.value_bytes,
        )


def _plain_json(value: Any) -> Any:
    """``value`` with ``Row``\\ s as objects (their field names), other containers kept."""
    if isinstance(value, tuple) and hasattr(value, "asDict"):
        return {k: _plain_json(v) for k, v in value.asDict().items()}
    if isinstance(value, list | tuple):
        return [_plain_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_json(v) for k, v in value.items()}
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.date | datetime.datetime | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return repr(value)


def _json_text(value: Any) -> str:
    try:
        return json.dumps(
            _plain_json(value), ensure_ascii=False, separators=(",", ":"), default=_json_default
        )
    except (TypeError, ValueError):  # e.g. a dict with tuple keys
        return json.dumps(repr(value), ensure_ascii=False)


def _decode(ser: Serializer[Any], data: bytes, what: str) -> Any:
    try:
        return ser.loads(data)
    except Exception as exc:
        raise InvalidArgument(f"{what}: cannot decode with {ser!r}: {exc}") from exc


def _state_row(
    kg: int, k: bytes, v: bytes, specs: Mapping[str, StateSpec | Serializer[Any] | _Recorded]
) -> StateRow:
    name, key, suffix = decode_state_key(k)
    spec = specs.get(name)
    if isinstance(spec, _Recorded):
        return _recorded_row(kg, name, key, suffix, v, spec)
    is_entry = suffix[:1] == MAP_TAG
    user_key_bytes = suffix[1:] if is_entry else None
    key_text = key.decode("utf-8", "backslashreplace")
    what = f"state {name!r} of key {key_text!r} (key group {kg})"
    kind: str | None = "map" if is_entry else None
    user_key: Any = user_key_bytes
    value: Any = v
    user_key_decoded = value_decoded = False
    if isinstance(spec, StateSpec):
        if is_entry != (spec.kind == "map"):
            found = "a map entry" if is_entry else "a single row (value, list or reducing)"
            raise InvalidArgument(f"{what} is {found}, not a {spec.kind} state as the spec says")
        kind = spec.kind
        if spec.kind == "list":
            value = [
                _decode(spec.serializer, e, f"{what}, element {i}")
                for i, e in enumerate(iter_elements(v))
            ]
        else:
            value = _decode(spec.serializer, v, what)
        value_decoded = True
        if spec.key_serializer is not None and user_key_bytes is not None:
            user_key = _decode(spec.key_serializer, user_key_bytes, f"{what}, map key")
            user_key_decoded = True
    elif spec is not None:
        kind = kind or "value"
        value = _decode(spec, v, what)
        value_decoded = True
    return StateRow(
        key_group=kg,
        key=key_text,
        state_name=name,
        state_kind=kind,
        user_key=user_key,
        value=value,
        key_bytes=key,
        user_key_bytes=user_key_bytes,
        value_bytes=v,
        user_key_decoded=user_key_decoded,
        value_decoded=value_decoded,
    )


def _loads(codec: Any, data: bytes, ttl: bool, what: str) -> tuple[Any, int | None]:
    """A value of a recorded schema (a ``Row``) and its expiry (states with a TTL)."""
    from dstl_client.processor.layout import unstamp

    try:
        expiry = None
        if ttl:
            expiry, data = unstamp(data)
        return codec.loads_row(data), expiry
    except Exception as exc:
        raise InvalidArgument(f"{what}: cannot decode with its recorded schema: {exc}") from exc


def _recorded_row(
    kg: int, name: str, key: bytes, suffix: bytes, v: bytes, spec: _Recorded
) -> StateRow:
    """A row of a state with a recorded schema: ``Row``\\ s of its schema, expiries apart."""
    state = spec.schema
    is_entry = suffix[:1] == MAP_TAG
    user_key_bytes = suffix[1:] if is_entry else None
    key_text = key.decode("utf-8", "backslashreplace")
    what = f"state {name!r} of key {key_text!r} (key group {kg})"
    if is_entry != (state.kind == "map"):
        found = "a map entry" if is_entry else "a single row"
        raise InvalidArgument(f"{what} is {found}, not a {state.kind} state as recorded")
    ttl = state.ttl_ms is not None
    user_key: Any = None
    expiry: Any
    if state.kind == "list":
        pairs = [
            _loads(spec.value_codec, e, ttl, f"{what}, element {i}")
            for i, e in enumerate(iter_elements(v))
        ]
        value: Any = [p[0] for p in pairs]
        expiry = [p[1] for p in pairs] if ttl else None
    else:
        value, expiry = _loads(spec.value_codec, v, ttl, what)
    if user_key_bytes is not None:
        try:
            user_key = spec.key_codec.loads_row(user_key_bytes)
        except Exception as exc:
            raise InvalidArgument(f"{what}, map key: cannot decode: {exc}") from exc
    return StateRow(
        key_group=kg,
        key=key_text,
        state_name=name,
        state_kind=state.kind,
        user_key=user_key,
        value=value,
        key_bytes=key,
        user_key_bytes=user_key_bytes,
        value_bytes=v,
        user_key_decoded=user_key_bytes is not None,
        value_decoded=True,
        expiry_ms=expiry,
    )


# -------------------------------------------------------- finding a record


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


# ----------------------------------------------------------- reading rows


def _key_groups(key_groups: Iterable[int] | None, max_parallelism: int) -> list[int]:
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
    specs = _decoders(_specs(serializers), schemas)
    kgs = _key_groups(key_groups, record.max_parallelism)
    return _rows(record, client, specs, kgs, workdir)


def _rows(
    record: CheckpointRecord,
    client: ChangelogClient,
    specs: Mapping[str, StateSpec | Serializer[Any] | _Recorded],
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
                        yield _state_row(kg, k, v, specs)
            shutil.rmtree(tmp / str(i), ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: where a state reader can be given its sidecar (a :class:`ConfigError` names it)
_HOW = f"pass dstl_address or set {ADDRESS_ENV} (the state is read through a sidecar)"


def _client(address: str | None, token: str | None) -> ChangelogClient:
    return shared_client(require_address(find_address(address), _HOW), find_token(token))


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
    """The rows of a retained checkpoint's state (see the module docstring), no Spark needed.

    ``client``: a sidecar client to use (else the process's shared client of
    ``dstl_address``). The record is resolved, and errors raised, by this
    call; the rows are read as the iterator is consumed.
    """
    specs = _specs(serializers)
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
        client or _client(dstl_address, dstl_token),
        serializers=specs,
        key_groups=key_groups,
        workdir=workdir,
        schemas=found.schemas,
    )


# ------------------------------------------------------------ the DataFrame

#: the option carrying what :func:`read_state` resolved (pickled)
_RESOLVED = "_resolved"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What every Spark task of a read needs: the record and how to read and decode it."""

    record_json: str
    serializers: dict[str, StateSpec | Serializer[Any]]
    address: str
    token: str | None
    key_groups: tuple[int, ...]
    partitions: int
    #: the state schema document the record names (its JSON), if any
    schemas_json: str | None = None
    #: typed rows of this state only (:func:`typed_schema`); ``None``: every state
    state_name: str | None = None

    def slices(self) -> list[tuple[int, ...]]:
        """The key groups split into ``partitions`` slices of consecutive ones."""
        n = max(1, min(self.partitions, len(self.key_groups)))
        kgs = self.key_groups
        return [kgs[i * len(kgs) // n : (i + 1) * len(kgs) // n] for i in range(n)]

    def schemas(self) -> OperatorSchemas | None:
        if self.schemas_json is None:
            return None
        return OperatorSchemas.from_bytes(self.schemas_json.encode("utf-8"), where="the plan")

    def spark_schema(self) -> Any:
        """The DataFrame's ``StructType``: :data:`SCHEMA_DDL`, or one state's typed columns."""
        schemas = self.schemas()
        if self.state_name is None or schemas is None:
            return _spark_schema()
        state = schemas.get(self.state_name)
        assert state is not None
        return typed_schema(schemas, state)


def _typed_state(
    schemas: OperatorSchemas | None, state_name: str, record: CheckpointRecord
) -> StateSchema:
    """The recorded schema of ``state_name``; :class:`ConfigError` naming what there is."""
    state = None if schemas is None else schemas.get(state_name)
    if state is None:
        recorded = (
            f"its recorded states are {', '.join(map(repr, schemas.names)) or 'none'}"
            if schemas is not None
            else "it records no state schemas (a process_keyed job, or one older than them): "
            "read every state with serializers instead"
        )
        raise ConfigError(
            f"state {state_name!r} has no recorded schema in batch {record.batch_id} of "
            f"operator {record.operator_id!r}: {recorded}"
        )
    return state


def typed_schema(schemas: OperatorSchemas, state: StateSchema) -> Any:
    """The columns of one state read alone, as Spark's ``statestore`` source gives them.

    ``key`` (a struct of the grouping column), then ``value`` (a value state),
    ``list_element`` (a list state: one row per element) or ``user_map_key``
    and ``user_map_value`` (a map state: one row per entry), each a struct of
    the declared schema; then ``partition_id`` (the subtask holding the key
    group in the checkpoint) and ``key_group``; with a TTL, ``expiration_ms``.
    """
    from pyspark.sql import types as T

    def struct(text: str) -> Any:
        return T.StructType.fromJson(json.loads(text))

    key_type = T.StringType() if schemas.key_type == "string" else T.LongType()
    fields = [T.StructField("key", T.StructType([T.StructField(schemas.key_column, key_type)]))]
    if state.kind == "map":
        assert state.key_schema is not None
        fields.append(T.StructField("user_map_key", struct(state.key_schema)))
        fields.append(T.StructField("user_map_value", struct(state.value_schema)))
    else:
        column = "value" if state.kind == "value" else "list_element"
        fields.append(T.StructField(column, struct(state.value_schema)))
    fields += [
        T.StructField("partition_id", T.IntegerType()),
        T.StructField("key_group", T.IntegerType()),
    ]
    if state.ttl_ms is not None:
        fields.append(T.StructField("expiration_ms", T.LongType()))
    return T.StructType(fields)


def _typed_rows(
    rows: Iterable[StateRow], schemas: OperatorSchemas, state: StateSchema, record: CheckpointRecord
) -> Iterator[tuple[Any, ...]]:
    """The rows of ``state`` as tuples of :func:`typed_schema`."""
    from dstl_client.processor.runner import KEY_DECODERS

    key_of = KEY_DECODERS[schemas.key_type]
    subtask = {kg: s.index for s in record.subtasks for kg in range(s.first, s.last + 1)}
    ttl = state.ttl_ms is not None
    for r in rows:
        if r.state_name != state.name:
            continue
        head = ((key_of(r.key_bytes),),)
        tail = (subtask.get(r.key_group), r.key_group)
        if state.kind == "list":
            expiries = r.expiry_ms if ttl else [None] * len(r.value)
            for element, expiry in zip(r.value, expiries, strict=True):
                yield (*head, element, *tail, *((expiry,) if ttl else ()))
            continue
        body = (r.user_key, r.value) if state.kind == "map" else (r.value,)
        yield (*head, *body, *tail, *((r.expiry_ms,) if ttl else ()))


def _parse_key_groups(text: str) -> list[int]:
    """``"0-15,31"`` -> ``[0, ..., 15, 31]``."""
    out: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, _, last = part.partition("-")
            out.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise ConfigError(f"keyGroups {text!r}: use e.g. '0-15,31'") from None
    return out


def _plan_from_options(options: Mapping[str, str]) -> _Plan:
    """The plan of a direct ``spark.read.format("dstl_state")`` read (no serializers: the
    recorded schemas decode; ``stateVarName`` reads one state's typed columns)."""
    found = load_state(
        checkpoint_dir=options.get("path") or options.get("checkpointlocation"),
        metadata_url=options.get("metadataurl"),
        operator_id=options.get("operatorid") or DEFAULT_OPERATOR,
        batch_id=int(options["batchid"]) if options.get("batchid") else None,
    )
    record = found.record
    state_name = options.get("statevarname") or None
    if state_name is not None:
        _typed_state(found.schemas, state_name, record)
    kgs = options.get("keygroups")
    address = find_address(options.get("dstladdress"))
    return _Plan(
        record_json=record.to_bytes().decode("utf-8"),
        schemas_json=None if found.schemas is None else found.schemas.to_bytes().decode("utf-8"),
        state_name=state_name,
        serializers={},
        address=address,
        token=find_token(),
        key_groups=tuple(
            _key_groups(_parse_key_groups(kgs) if kgs else None, record.max_parallelism)
        ),
        partitions=int(options.get("partitions") or 0) or record.parallelism,
    )


def _spark_schema() -> Any:
    """:data:`SCHEMA_DDL` as a ``StructType`` (built without a session: executors have none)."""
    from pyspark.sql import types as T

    kinds = {"int": T.IntegerType(), "string": T.StringType(), "binary": T.BinaryType()}
    fields = [column.split() for column in SCHEMA_DDL.split(",")]
    return T.StructType([T.StructField(name, kinds[kind], True) for name, kind in fields])


def _read_slice(plan: _Plan, key_groups: Sequence[int]) -> Iterator[Any]:
    """One Spark task: its key groups' rows as Arrow batches of :data:`CHUNK_ROWS` rows
    (one state's typed rows: as tuples, Spark converts them by :func:`typed_schema`)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    record = CheckpointRecord.from_bytes(plan.record_json.encode("utf-8"))
    schemas = plan.schemas()
    # the sidecar of this node, like the job's tasks; else the one the reader was given
    address = find_address(passed=plan.address)
    client = _client(address, find_token(passed=plan.token))
    # the scratch store on the node's state disk when it has one (the temp dir may be small)
    workdir = os.environ.get(STATE_DIR_ENV) or None
    if workdir:
        os.makedirs(workdir, exist_ok=True)
    rows = iter_record_rows(
        record,
        client,
        serializers=plan.serializers,
        key_groups=key_groups,
        workdir=workdir,
        schemas=schemas,
    )
    if plan.state_name is not None and schemas is not None:
        state = _typed_state(schemas, plan.state_name, record)
        try:
            yield from _typed_rows(rows, schemas, state, record)
        finally:
            rows.close()
        return
    # exactly the schema Spark checks the batches against
    schema = to_arrow_schema(_spark_schema(), timezone="UTC")
    chunk: list[tuple[Any, ...]] = []
    try:
        for row in rows:
            chunk.append(row.as_tuple())
            if len(chunk) >= CHUNK_ROWS:
                yield _batch(pa, schema, chunk)
                chunk = []
        if chunk:
            yield _batch(pa, schema, chunk)
    finally:
        rows.close()


def _batch(pa: Any, schema: Any, rows: list[tuple[Any, ...]]) -> Any:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)],
        schema=schema,
    )


try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - the pure-Python reader needs no Spark
    pass
else:

    class StateDataSource(DataSource):
        """``spark.read.format("dstl_state")``: a checkpoint's state (see the module docstring)."""

        @classmethod
        def name(cls) -> str:
            return FORMAT

        def _plan(self) -> _Plan:
            blob = self.options.get(_RESOLVED.lower()) or self.options.get(_RESOLVED)
            if blob:
                plan: _Plan = pickle.loads(base64.b64decode(blob))
                return plan
            return _plan_from_options({k.lower(): v for k, v in self.options.items()})

        def schema(self) -> Any:
            return self._plan().spark_schema()

        def reader(self, schema: Any) -> DataSourceReader:
            return _StateReader(self._plan())

    class _StateReader(DataSourceReader):
        def __init__(self, plan: _Plan) -> None:
            self.plan = plan

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(s) for s in self.plan.slices()]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            return _read_slice(self.plan, partition.value)


def read_state(
    spark: Any,
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
    partitions: int | None = None,
    state_name: str | None = None,
) -> Any:
    """A retained checkpoint's state as a DataFrame (columns in the module docstring).

    The record is resolved here (errors are raised now); the rows are read
    when an action runs, by ``partitions`` Spark tasks (default: the
    checkpoint's parallelism), each restoring a slice of the key groups.
    ``state_name`` (Spark's ``stateVarName``): that state's rows only, as typed
    columns from its recorded schema (:func:`typed_schema`).
    """
    require_spark("read_state")
    from pyspark import cloudpickle

    specs = _specs(serializers)
    found = load_state(
        checkpoint_dir=checkpoint_dir,
        metadata_url=metadata_url,
        operator_id=operator_id,
        batch_id=batch_id,
        metadata_s3_endpoint_url=metadata_s3_endpoint_url,
        metadata_s3_region=metadata_s3_region,
    )
    address = require_address(find_address(dstl_address), _HOW)
    if partitions is not None and partitions < 1:
        raise ConfigError(f"partitions={partitions}: must be >= 1")
    record, schemas = found.record, found.schemas
    if state_name is not None:
        _typed_state(schemas, state_name, record)
        if state_name in specs:
            raise ConfigError(
                f"state {state_name!r} read alone has typed columns from its recorded schema: "
                "give it no serializer"
            )
    plan = _Plan(
        record_json=record.to_bytes().decode("utf-8"),
        schemas_json=None if schemas is None else schemas.to_bytes().decode("utf-8"),
        state_name=state_name,
        serializers=specs,
        address=address,
        token=find_token(dstl_token),
        key_groups=tuple(_key_groups(key_groups, record.max_parallelism)),
        partitions=partitions or record.parallelism,
    )
    # cloudpickle: serializers defined in __main__ or a notebook travel by value
    blob = base64.b64encode(cloudpickle.dumps(plan)).decode("ascii")  # type: ignore[no-untyped-call]
    spark.dataSource.register(StateDataSource)
    return spark.read.format(FORMAT).option(_RESOLVED, blob).load()
