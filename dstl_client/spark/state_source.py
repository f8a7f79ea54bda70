"""The Spark data source of a checkpoint's state: ``spark.read.format("dstl_state")``.

:func:`read_state` resolves the checkpoint record in the caller's process
(:mod:`.state_location`) and hands it, pickled, to the ``dstl_state`` Python
data source (:class:`StateDataSource`); its partitions are slices of the key
groups, each Spark task restores its slice through the sidecar of its node
(:mod:`.state_rows`) and streams the rows out as Arrow batches of
:data:`CHUNK_ROWS` rows. Why it is built this way, and the options of a direct
``spark.read.format("dstl_state")``: :mod:`dstl_client.spark.state_reader`.
A plan is immutable; each Spark task reads its own slice.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.connect import find_address, find_token
from dstl_client.coordinator.config import DEFAULT_OPERATOR
from dstl_client.coordinator.state_schemas import OperatorSchemas, StateSchema
from dstl_client.core.errors import ConfigError
from dstl_client.extras import require_spark
from dstl_client.spark.state_decode import SCHEMA_DDL, StateRow, StateSpec, check_specs
from dstl_client.spark.state_location import load_state
from dstl_client.spark.state_rows import (
    iter_record_rows,
    key_group_list,
    reader_client,
    sidecar_address,
)
from dstl_client.state.clients import STATE_DIR_ENV
from dstl_client.state.serializers import Serializer

__all__ = ["CHUNK_ROWS", "FORMAT", "read_state", "typed_schema"]

#: the data source's short name (``spark.read.format(FORMAT)``)
FORMAT = "dstl_state"
#: rows per Arrow batch a Spark task sends
CHUNK_ROWS = 4096
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
            key_group_list(_parse_key_groups(kgs) if kgs else None, record.max_parallelism)
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
    token = find_token(passed=plan.token)
    client = reader_client(address, token)
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
        """``spark.read.format("dstl_state")``: a checkpoint's state (see :mod:`.state_reader`)."""

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

    specs = check_specs(serializers)
    found = load_state(
        checkpoint_dir=checkpoint_dir,
        metadata_url=metadata_url,
        operator_id=operator_id,
        batch_id=batch_id,
        metadata_s3_endpoint_url=metadata_s3_endpoint_url,
        metadata_s3_region=metadata_s3_region,
    )
    address = sidecar_address(dstl_address)
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
        key_groups=tuple(key_group_list(key_groups, record.max_parallelism)),
        partitions=partitions or record.parallelism,
    )
    # cloudpickle: serializers defined in __main__ or a notebook travel by value
    blob = base64.b64encode(cloudpickle.dumps(plan)).decode("ascii")  # type: ignore[no-untyped-call]
    spark.dataSource.register(StateDataSource)
    return spark.read.format(FORMAT).option(_RESOLVED, blob).load()
