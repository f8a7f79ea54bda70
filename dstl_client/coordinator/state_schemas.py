"""The state schemas of a keyed operator: recorded once per change, named by every record.

A processor declares its states in ``init`` (``getValueState("count", "n
long")``...); the driver runs ``init`` on a copy before the query starts
and gets every state's kind, schemas and TTL. That declaration is an
:class:`OperatorSchemas` document, stored write-once in the job's metadata
store under the operator's records prefix, named by its content::

    <records prefix>schemas/<schema id>.json      e.g. checkpoints/schemas/3f2a...e1.json

and every checkpoint record of the run names it (``state_schema``, the id:
32 hex digits of the SHA-256 of the canonical JSON), so a record stays
small and a reader (:mod:`dstl_client.spark.state_reader`, ``dstl state
get``) decodes typed values with no serializer. A record without the field
(older jobs, ``process_keyed``) is read with serializers as before.

A run's declaration is checked against the recorded one at start
(:mod:`.schema_evolution`).

Schemas are kept as Spark's JSON of a ``StructType`` (``StructType.json()``:
canonical, sorted keys), so this module needs no PySpark: messages render
the JSON as DDL-like text itself.

Pure data and functions, plus store reads and write-once writes: any thread.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dstl_client.checkpoint.codec import (
    FieldError,
    json_field,
    json_int,
    json_list,
    json_object,
    json_str,
)
from dstl_client.coordinator.metadata import CorruptMetadata, MetadataStore

__all__ = [
    "KINDS",
    "SCHEMAS",
    "OperatorSchemas",
    "StateSchema",
    "load_schemas",
    "render_type",
    "schema_name",
    "write_schemas",
]

SCHEMA_FORMAT = 1
#: the folder of the schema documents, under an operator's records prefix
SCHEMAS = "schemas/"
#: the kinds of state a document describes
KINDS = ("value", "list", "map")
#: the grouping key's kinds (as the processor's key decoders name them)
KEY_TYPES = ("string", "integer")
#: an id is this many hex digits of the SHA-256 of the canonical JSON
ID_HEX = 32
#: the most states one document may hold (a bound on what a reader decodes)
MAX_STATES = 10_000


@dataclass(frozen=True, slots=True)
class StateSchema:
    """One state as declared: kind, schemas (Spark JSON text) and TTL.

    Invariant: ``key_schema`` is set exactly for map states (the user key's
    struct); ``value_schema`` is the struct of a value, list element or map
    value; schemas are canonical JSON text (``StructType.json()``).
    """

    name: str
    kind: str
    value_schema: str
    key_schema: str | None = None
    ttl_ms: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"state {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if (self.kind == "map") != (self.key_schema is not None):
            raise ValueError(f"state {self.name!r}: a key schema is for map states only")

    def describe(self) -> str:
        """``map<struct<page: string>, struct<n: bigint>> TTL 60000 ms``-like text (messages)."""
        value = render_type(json.loads(self.value_schema))
        if self.key_schema is not None:
            text = f"map state <{render_type(json.loads(self.key_schema))}, {value}>"
        else:
            text = f"{self.kind} state {value}"
        return text + ("" if self.ttl_ms is None else f" with TTL {self.ttl_ms} ms")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "value_schema": json.loads(self.value_schema),
        }
        if self.key_schema is not None:
            out["key_schema"] = json.loads(self.key_schema)
        if self.ttl_ms is not None:
            out["ttl_ms"] = self.ttl_ms
        return out

    @classmethod
    def from_json(cls, doc: Any, what: str) -> StateSchema:
        doc = json_object(doc, what)
        name = json_str(json_field(doc, "name", f"{what}.name"), f"{what}.name")
        kind = json_str(json_field(doc, "kind", f"{what}.kind"), f"{what}.kind")
        if kind not in KINDS:
            raise FieldError(f"{what}.kind: {kind!r} is not one of {', '.join(KINDS)}")
        value = _struct_text(json_field(doc, "value_schema", f"{what}.value_schema"), what)
        key_doc = doc.get("key_schema")
        key = None if key_doc is None else _struct_text(key_doc, what)
        if (kind == "map") != (key is not None):
            raise FieldError(f"{what}.key_schema: a map state has one, other states none")
        ttl_doc = doc.get("ttl_ms")
        ttl = None if ttl_doc is None else json_int(ttl_doc, f"{what}.ttl_ms", 1, 2**63 - 1)
        return cls(name, kind, value, key, ttl)


def _struct_text(doc: Any, what: str) -> str:
    obj = json_object(doc, f"{what} schema")
    if obj.get("type") != "struct" or not isinstance(obj.get("fields"), list):
        raise FieldError(f"{what}: a schema is a Spark struct type's JSON")
    return canonical(obj)


def canonical(doc: Any) -> str:
    """JSON text as ``StructType.json()`` writes it (sorted keys, no spaces)."""
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True, slots=True)
class OperatorSchemas:
    """Every state of one keyed operator, and its grouping key (see the module doc).

    Invariant: ``states`` sorted by name, names unique. Immutable: any thread.
    """

    #: the grouping column's name and kind (``string`` or ``integer``)
    key_column: str
    key_type: str
    states: tuple[StateSchema, ...] = ()

    def __post_init__(self) -> None:
        names = [s.name for s in self.states]
        if len(set(names)) != len(names):
            raise ValueError(f"a state name appears twice in {names}")
        object.__setattr__(self, "states", tuple(sorted(self.states, key=_name)))
        if self.key_type not in KEY_TYPES:
            raise ValueError(f"key type {self.key_type!r} is not one of {KEY_TYPES}")

    def get(self, name: str) -> StateSchema | None:
        for s in self.states:
            if s.name == name:
                return s
        return None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.states]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SCHEMA_FORMAT,
            "key": {"column": self.key_column, "type": self.key_type},
            "states": [s.to_json() for s in self.states],
        }

    def to_bytes(self) -> bytes:
        return canonical(self.to_json()).encode("utf-8")

    @property
    def schema_id(self) -> str:
        """The document's name: :data:`ID_HEX` hex digits of the SHA-256 of :meth:`to_bytes`."""
        return hashlib.sha256(self.to_bytes()).hexdigest()[:ID_HEX]

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> OperatorSchemas:
        """The document of ``data``; :class:`CorruptMetadata` naming ``where`` and the field."""
        try:
            doc = json_object(json.loads(data), "the schema document")
            fmt = doc.get("format")
            if fmt != SCHEMA_FORMAT or isinstance(fmt, bool):
                raise FieldError(f"format: unsupported state schema format {fmt!r}")
            key = json_object(json_field(doc, "key"), "key")
            key_type = json_str(json_field(key, "type", "key.type"), "key.type")
            if key_type not in KEY_TYPES:
                raise FieldError(f"key.type: {key_type!r} is not one of {', '.join(KEY_TYPES)}")
            items = json_list(json_field(doc, "states"), "states")
            if len(items) > MAX_STATES:
                raise FieldError(f"states: {len(items)} states, more than {MAX_STATES}")
            states = [StateSchema.from_json(s, f"states[{i}]") for i, s in enumerate(items)]
            if len({s.name for s in states}) != len(states):
                raise FieldError("states: a name appears twice")
            return cls(
                json_str(json_field(key, "column", "key.column"), "key.column"),
                key_type,
                tuple(states),
            )
        except (ValueError, RecursionError) as exc:  # FieldError is a ValueError, as is bad JSON
            raise CorruptMetadata(f"{where}: {exc}") from None


def _name(s: StateSchema) -> str:
    return s.name


# ------------------------------------------------------------- rendering

_SIMPLE = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}


def render_type(doc: Any) -> str:
    """Spark's JSON of a data type as DDL-like text (``struct<n: bigint NOT NULL>``)."""
    if isinstance(doc, str):
        return _SIMPLE.get(doc, doc)
    if not isinstance(doc, dict):
        return repr(doc)
    kind = doc.get("type")
    if kind == "struct":
        fields = []
        for f in doc.get("fields") or ():
            if not isinstance(f, dict):
                fields.append(repr(f))
                continue
            null = "" if f.get("nullable", True) else " NOT NULL"
            fields.append(f"{f.get('name')}: {render_type(f.get('type'))}{null}")
        return f"struct<{', '.join(fields)}>"
    if kind == "array":
        return f"array<{render_type(doc.get('elementType'))}>"
    if kind == "map":
        return f"map<{render_type(doc.get('keyType'))}, {render_type(doc.get('valueType'))}>"
    return canonical(doc)


# ------------------------------------------------------------------ store


def schema_name(records_prefix: str, schema_id: str) -> str:
    """Where the document ``schema_id`` of an operator is in the job's metadata store."""
    return f"{records_prefix}{SCHEMAS}{schema_id}.json"


def write_schemas(store: MetadataStore, records_prefix: str, doc: OperatorSchemas) -> str:
    """Write ``doc`` once (a document already there with its id is the same); its id."""
    schema_id = doc.schema_id
    name = schema_name(records_prefix, schema_id)
    data = doc.to_bytes()
    if not store.put_once(name, data) and store.get(name) != data:
        raise CorruptMetadata(
            f"{store.describe(name)}: holds another document than its name says ({schema_id})"
        )
    return schema_id


def load_schemas(store: MetadataStore, records_prefix: str, schema_id: str) -> OperatorSchemas:
    """The document ``schema_id``; :class:`CorruptMetadata` when it is missing or damaged."""
    name = schema_name(records_prefix, schema_id)
    where = store.describe(name)
    data = store.get(name)
    if data is None:
        raise CorruptMetadata(f"{where}: the state schema a checkpoint record names is missing")
    doc = OperatorSchemas.from_bytes(data, where=where)
    if doc.schema_id != schema_id:
        raise CorruptMetadata(f"{where}: its content is document {doc.schema_id}, not {schema_id}")
    return doc


def declared_of(
    key_column: str,
    key_type: str,
    states: Mapping[str, tuple[str, str, str | None, int | None]],
) -> OperatorSchemas:
    """A document from ``{name: (kind, value schema JSON, key schema JSON or None, TTL)}``."""
    return OperatorSchemas(
        key_column,
        key_type,
        tuple(
            StateSchema(name, kind, value, key, ttl)
            for name, (kind, value, key, ttl) in sorted(states.items())
        ),
    )
