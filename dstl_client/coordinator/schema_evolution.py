"""A keyed operator's state schemas across runs: what a new declaration may change.

**At start** (:func:`adopt`, before the first batch): the document of the
latest record, if it names one, is compared with the declared one. A state
declared in both must be compatible (:func:`incompatibilities`): the same
kind, key and value types field by field (names, order, nesting), with two
changes allowed because the stored bytes read the same: a ``NOT NULL``
field may become nullable, and a TTL's duration may change (a TTL may not
be added or removed: values with one carry their expiry). Otherwise
:class:`StateSchemaMismatch` names the state and both schemas, and the
query does not start. A state no longer declared keeps its recorded schema
(its rows are still there: a later run declaring it again is compared with
it), unless ``init`` deletes it (``deleteIfExists``), which removes its
rows. New states are added. The grouping key's type may not change.

Pure functions, plus the store reads and write-once writes of
:mod:`.state_schemas`: any thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from dstl_client.coordinator.metadata import MetadataStore
from dstl_client.coordinator.state_schemas import (
    OperatorSchemas,
    StateSchema,
    canonical,
    load_schemas,
    render_type,
    write_schemas,
)
from dstl_client.core.errors import ConfigError

__all__ = ["StateSchemaMismatch", "adopt", "incompatibilities", "merged"]


class StateSchemaMismatch(ConfigError):
    """A state's declared schema cannot read what the checkpoint holds (see the module doc)."""

    kind = "state_schema_mismatch"


def _type_problem(old: Any, new: Any, path: str) -> str | None:
    """Why values stored as ``old`` cannot be read as ``new`` (``None``: they can)."""
    if isinstance(old, dict) and isinstance(new, dict) and old.get("type") == new.get("type"):
        kind = old.get("type")
        if kind == "struct":
            of, nf = old.get("fields") or [], new.get("fields") or []
            if len(of) != len(nf):
                return f"{path or 'the struct'} has {len(nf)} fields, the recorded one {len(of)}"
            for o, n in zip(of, nf, strict=True):
                where = f"{path}.{o.get('name')}" if path else str(o.get("name"))
                if o.get("name") != n.get("name"):
                    return f"field {where} is now called {n.get('name')!r}"
                if o.get("nullable", True) and not n.get("nullable", True):
                    return f"field {where} became NOT NULL (recorded values may be null)"
                problem = _type_problem(o.get("type"), n.get("type"), where)
                if problem:
                    return problem
            return None
        if kind == "array":
            return _type_problem(old.get("elementType"), new.get("elementType"), f"{path}[]")
        if kind == "map":
            return _type_problem(
                old.get("keyType"), new.get("keyType"), f"{path} key"
            ) or _type_problem(old.get("valueType"), new.get("valueType"), f"{path} value")
    if canonical(old) == canonical(new):
        return None
    return f"{path or 'the value'} is {render_type(new)}, recorded as {render_type(old)}"


def incompatibilities(recorded: StateSchema, declared: StateSchema) -> list[str]:
    """Why ``declared`` cannot read the values stored under ``recorded`` (empty: it can).

    See the module documentation for the rules.
    """
    if recorded.kind != declared.kind:
        return [f"it was a {recorded.kind} state"]
    out: list[str] = []
    if (recorded.ttl_ms is None) != (declared.ttl_ms is None):
        out.append("a TTL cannot be added or removed (values with a TTL carry their expiry)")
    pairs = [("value", recorded.value_schema, declared.value_schema)]
    if recorded.key_schema is not None and declared.key_schema is not None:
        pairs.insert(0, ("user key", recorded.key_schema, declared.key_schema))
    for what, old, new in pairs:
        problem = _type_problem(json.loads(old), json.loads(new), "")
        if problem:
            out.append(f"its {what}: {problem}")
    return out


def merged(
    recorded: OperatorSchemas | None, declared: OperatorSchemas, deleted: Iterable[str] = ()
) -> OperatorSchemas:
    """The document to record: the declared states plus recorded ones not declared nor deleted.

    Raises :class:`StateSchemaMismatch` naming every incompatible state and
    both its schemas, and for a changed grouping key type.
    """
    if recorded is None:
        return declared
    gone = set(deleted)
    problems: list[str] = []
    if recorded.key_type != declared.key_type:
        problems.append(
            f"the grouping key {declared.key_column!r} is {declared.key_type}, the checkpoint's "
            f"key {recorded.key_column!r} is {recorded.key_type}"
        )
    states = {s.name: s for s in declared.states}
    for old in recorded.states:
        new = states.get(old.name)
        if old.name in gone:
            continue
        if new is None:
            states[old.name] = old  # its rows are still there
            continue
        reasons = incompatibilities(old, new)
        if reasons:
            problems.append(
                f"state {old.name!r}: declared as {new.describe()}, recorded as "
                f"{old.describe()}: {'; '.join(reasons)}"
            )
    if problems:
        raise StateSchemaMismatch(
            "the processor's state schemas cannot read its checkpoint: "
            + " | ".join(problems)
            + " (keep the recorded schema, or use a new state name; deleteIfExists in init "
            "drops a state's rows and its schema)"
        )
    return replace(declared, states=tuple(sorted(states.values(), key=lambda s: s.name)))


def adopt(
    store: MetadataStore,
    records_prefix: str,
    recorded_id: str | None,
    declared: OperatorSchemas,
    deleted: Iterable[str] = (),
) -> str:
    """At start: check ``declared`` against the document ``recorded_id`` (the latest
    record's, if any), write what this run records, and return its id.

    Raises :class:`StateSchemaMismatch` (see :func:`merged`); nothing is
    written then.
    """
    recorded = None if recorded_id is None else load_schemas(store, records_prefix, recorded_id)
    return write_schemas(store, records_prefix, merged(recorded, declared, deleted))
