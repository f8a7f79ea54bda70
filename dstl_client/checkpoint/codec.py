"""JSON helpers shared by the records and the messages: handles as text, typed dataclasses.

Pure functions, safe from any thread.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from typing import Any, TypeVar

from dstl_client.core.errors import DstlError, InvalidArgument
from dstl_client.core.handle import ChangelogHandle

T = TypeVar("T")


class FieldError(ValueError):
    """A JSON value of the wrong type or out of range; the message says which and why.

    Readers of whole documents catch it and raise the typed error of their
    document, naming the file (e.g. :class:`CorruptMetadata`).
    """


class CorruptMetadata(InvalidArgument):
    """A metadata object (a checkpoint record, the overrides, a restore marker) that does
    not decode or holds a value out of range; the message names the object and what is
    wrong. Never skipped: a reader that cannot read a record must not act as if it had none.
    """

    kind = "corrupt_metadata"


def shown(value: Any, limit: int = 40) -> str:
    """A short repr of a JSON value for messages (huge integers and strings cut)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_int(value: Any, what: str, lo: int, hi: int) -> int:
    """``value`` if it is a JSON integer (not a bool) in ``[lo, hi]``, else :class:`FieldError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise FieldError(f"{what}: {shown(value)} is not an integer from {lo} to {hi}")
    return value


def json_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise FieldError(f"{what}: {shown(value)} is not a string")
    return value


def json_number(value: Any, what: str) -> float:
    """A finite JSON number as a float (an integer too large for a float is refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"{what}: {shown(value)} is not a number")
    try:
        out = float(value)
    except OverflowError:
        raise FieldError(f"{what}: {shown(value)} is out of range") from None
    if not math.isfinite(out):
        raise FieldError(f"{what}: {shown(value)} is not finite")
    return out


def json_list(value: Any, what: str, length: int | None = None) -> list[Any]:
    """``value`` if it is a JSON array (of ``length`` items when given)."""
    if not isinstance(value, list):
        raise FieldError(f"{what}: {shown(value)} is not a list")
    if length is not None and len(value) != length:
        raise FieldError(f"{what}: {len(value)} items, not {length}")
    return value


def json_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FieldError(f"{what}: {shown(value)} is not a JSON object")
    return value


def json_field(doc: dict[str, Any], key: str, what: str = "") -> Any:
    """``doc[key]``, or :class:`FieldError` naming the missing field."""
    try:
        return doc[key]
    except KeyError:
        raise FieldError(f"{what or key}: missing") from None


def handle_to_text(handle: ChangelogHandle) -> str:
    """A handle as base64 text (its ``dstl.v1.Handle`` bytes)."""
    return base64.b64encode(handle.to_bytes()).decode("ascii")


def handle_from_text(text: str, what: str = "handle") -> ChangelogHandle:
    """The handle of :func:`handle_to_text`; :class:`FieldError` when it does not decode."""
    if not isinstance(text, str):
        raise FieldError(f"{what}: {shown(text)} is not a handle (base64 text)")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FieldError(f"{what}: not base64 ({exc})") from None
    try:
        return ChangelogHandle.from_bytes(data)
    except (DstlError, ValueError) as exc:
        raise FieldError(f"{what}: not a handle ({exc})") from None


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
    A value that does not convert (a string for a number, a number too large
    for a float, a non-finite float for an integer) raises :class:`FieldError`
    naming the field.
    """
    if doc is not None and not isinstance(doc, dict):
        raise FieldError(f"{cls.__name__}: {shown(doc)} is not a JSON object")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if doc is not None and f.name in doc:
            try:
                values[f.name] = _coerce(f.default, doc[f.name])
            except (TypeError, ValueError, OverflowError) as exc:
                raise FieldError(f"{f.name}: {shown(doc[f.name])} ({exc})") from None
    return cls(**values)


def flat_to_json(obj: Any) -> dict[str, Any]:
    """The JSON object of a flat dataclass (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(obj).items()}
