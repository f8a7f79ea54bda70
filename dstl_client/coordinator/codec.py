"""JSON helpers shared by the records and the messages: handles as text, typed dataclasses.

Pure functions, safe from any thread.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, TypeVar

from dstl_client.core.handle import ChangelogHandle

T = TypeVar("T")


def handle_to_text(handle: ChangelogHandle) -> str:
    """A handle as base64 text (its ``dstl.v1.Handle`` bytes)."""
    return base64.b64encode(handle.to_bytes()).decode("ascii")


def handle_from_text(text: str) -> ChangelogHandle:
    return ChangelogHandle.from_bytes(base64.b64decode(text))


def _coerce(default: Any, value: Any) -> Any:
    """``value`` as the type of the field's ``default`` (JSON has one number type)."""
    if default is None:  # an optional float
        return None if value is None else float(value)
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, int):
        return int(value or 0)
    if isinstance(default, float):
        return float(value or 0.0)
    if isinstance(default, str):
        return "" if value is None else str(value)
    if isinstance(default, tuple):
        return tuple(value or ())
    raise TypeError(f"no JSON coercion for a field defaulting to {default!r}")


def flat_from_json(cls: type[T], doc: dict[str, Any] | None) -> T:
    """A flat frozen dataclass whose fields all have defaults, from its JSON object.

    Every field is converted to its default's type; missing fields keep their
    default and unknown keys are ignored (older and newer writers both read).
    """
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if doc is not None and f.name in doc:
            values[f.name] = _coerce(f.default, doc[f.name])
    return cls(**values)


def flat_to_json(obj: Any) -> dict[str, Any]:
    """The JSON object of a flat dataclass (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(obj).items()}
