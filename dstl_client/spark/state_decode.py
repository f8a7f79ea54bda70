"""How a stored row of a checkpoint's state becomes a :class:`StateRow`.

A row key says which state and key a row belongs to and whether it is a map
entry; the serializers given (:class:`StateSpec`, or a bare
:class:`~dstl_client.state.serializers.Serializer`) or the state's recorded
schema (:mod:`dstl_client.coordinator.state_schemas`) say how its bytes
decode. Pure functions and frozen records: any thread may use them. The user
documentation of the columns is in :mod:`dstl_client.spark.state_reader`.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from dstl_client.coordinator.state_schemas import OperatorSchemas, StateSchema
from dstl_client.core.errors import InvalidArgument
from dstl_client.extras import require_spark
from dstl_client.state.changes import MAP_TAG, decode_state_key, iter_elements
from dstl_client.state.serializers import Serializer

__all__ = [
    "KINDS",
    "SCHEMA_DDL",
    "Decoder",
    "Recorded",
    "StateRow",
    "StateSpec",
    "check_specs",
    "decoders",
    "state_row",
]

SCHEMA_DDL = (
    "key_group int, key string, state_name string, state_kind string, user_key string, "
    "value string, user_key_bytes binary, value_bytes binary"
)
KINDS = ("value", "list", "map", "reducing")


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


def check_specs(
    serializers: Mapping[str, Serializer[Any] | StateSpec] | None,
) -> dict[str, StateSpec | Serializer[Any]]:
    """The ``serializers`` argument, checked: named states, each a serializer or a spec."""
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
class Recorded:
    """How a state with a recorded schema is decoded: its codecs (built from the schema)."""

    schema: StateSchema
    value_codec: Any
    key_codec: Any = None

    @classmethod
    def of(cls, schema: StateSchema) -> Recorded:
        from dstl_client.processor.codec import RowCodec

        def codec(text: str) -> Any:
            from pyspark.sql.types import StructType

            return RowCodec(StructType.fromJson(json.loads(text)))

        key = None if schema.key_schema is None else codec(schema.key_schema)
        return cls(schema, codec(schema.value_schema), key)


#: how one state is decoded: the spec or serializer given, else its recorded schema
Decoder: TypeAlias = "StateSpec | Serializer[Any] | Recorded"


def decoders(
    specs: Mapping[str, StateSpec | Serializer[Any]], schemas: OperatorSchemas | None
) -> dict[str, Decoder]:
    """Per state name: the serializers given, else the recorded schema's codecs."""
    out: dict[str, Decoder] = {}
    if schemas is not None:
        if any(s.name not in specs for s in schemas.states):
            require_spark("decoding states by their recorded schemas")
        for state in schemas.states:
            if state.name not in specs:
                out[state.name] = Recorded.of(state)
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


def state_row(kg: int, k: bytes, v: bytes, specs: Mapping[str, Decoder]) -> StateRow:
    name, key, suffix = decode_state_key(k)
    spec = specs.get(name)
    if isinstance(spec, Recorded):
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
    kg: int, name: str, key: bytes, suffix: bytes, v: bytes, spec: Recorded
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
