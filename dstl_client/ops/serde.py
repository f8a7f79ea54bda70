"""``dstl state get``'s serializers: named on the command line, or the job's own.

``--serializer NAME=SPEC`` (repeatable), SPEC one of::

    int64 | float64 | bool | str | bytes | json              a value (or reducing) state
    a,b,...                                                 a tuple of those
    value:S | reducing:S | list:S                           that kind of state, elements S
    map:K:V                                                 a map state, keys K, values V

``--serializers module:attribute`` imports the job's own mapping of state
names to serializers or :class:`~dstl_client.spark.state_reader.StateSpec`
(what ``read_state(serializers=...)`` takes); ``--serializer`` entries win.

``pickle`` is not offered: the bytes come from storage, and unpickling runs
whatever code they name, so an operator reading a key must not execute what
anyone with write access to the store put there. A job whose states are
pickled names its own serializers with ``--serializers`` (its code, its risk).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from dstl_client.core.errors import ConfigError
from dstl_client.state.serializers import (
    BOOL,
    BYTES,
    FLOAT64,
    INT64,
    JSON,
    STR,
    Serializer,
    TupleSerializer,
)

SCALARS: dict[str, Serializer[Any]] = {
    "int64": INT64,
    "float64": FLOAT64,
    "bool": BOOL,
    "str": STR,
    "bytes": BYTES,
    "json": JSON,
}
#: names refused with a reason rather than "unknown"
REFUSED = {
    "pickle": "unpickling bytes read from storage runs whatever code they name; name the "
    "job's own serializers with --serializers MODULE:ATTR instead",
}


def scalar(text: str) -> Serializer[Any]:
    names = [t.strip() for t in text.split(",")]
    for n in names:
        if n in REFUSED:
            raise ConfigError(f"serializer {n!r} is not offered: {REFUSED[n]}")
    unknown = [n for n in names if n not in SCALARS]
    if unknown or not names:
        raise ConfigError(
            f"unknown serializer {', '.join(unknown) or repr(text)}: one of {', '.join(SCALARS)}, "
            "or a comma-separated tuple of them"
        )
    if len(names) == 1:
        return SCALARS[names[0]]
    return TupleSerializer(*(SCALARS[n] for n in names))


def parse_spec(text: str) -> Any:
    """A :class:`Serializer` or ``StateSpec`` from ``SPEC`` (see the module docstring)."""
    from dstl_client.spark.state_reader import StateSpec

    kind, sep, rest = text.partition(":")
    if not sep:
        return scalar(text)
    if kind == "map":
        k, sep2, v = rest.partition(":")
        if not sep2:
            raise ConfigError(f"serializer {text!r}: a map is map:KEY:VALUE, e.g. map:str:int64")
        return StateSpec.map_state(scalar(k), scalar(v))
    makers = {
        "value": StateSpec.value_state,
        "list": StateSpec.list_state,
        "reducing": StateSpec.reducing_state,
    }
    if kind not in makers:
        raise ConfigError(f"serializer {text!r}: the kind is value, list, reducing or map")
    return makers[kind](scalar(rest))


def serializers(named: Sequence[str], module_attr: str | None) -> dict[str, Any]:
    """The serializers of ``--serializers`` then ``--serializer`` (which win)."""
    out: dict[str, Any] = {}
    if module_attr:
        module, sep, attr = module_attr.partition(":")
        if not sep or not module or not attr:
            raise ConfigError(f"--serializers {module_attr!r}: give module:attribute")
        try:
            found = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"--serializers {module_attr!r}: {exc}") from None
        if not isinstance(found, Mapping):
            raise ConfigError(f"--serializers {module_attr!r} is not a mapping of state names")
        out.update(found)
    for item in named:
        name, sep, spec = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--serializer {item!r}: give NAME=SPEC, e.g. count=int64")
        out[name] = parse_spec(spec)
    return out
