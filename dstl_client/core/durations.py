"""Durations written as text: the one parser of the project (sidecar, driver, CLI, jobs).

Syntax (case-insensitive, spaces optional):

* one or more parts, each a number and a unit, added up: ``500ms``, ``5s``,
  ``1.5 h``, ``10min``, ``1 minute 30 seconds``, ``1h30m``; Spark's form with
  a leading ``interval`` (``interval 2 minutes``) too;
* units: ``ms`` / ``millisecond(s)``; ``s`` / ``sec`` / ``second(s)``;
  ``m`` / ``min`` / ``minute(s)``; ``h`` / ``hour(s)``; ``d`` / ``day(s)``;
  ``w`` / ``week(s)``;
* numbers: digits with an optional fraction (``1.5``), no sign, no exponent;
* a bare number (``60000``) only where the caller names the unit it stands
  for (``bare_unit``): milliseconds for Spark's ``processingTime`` and the
  driver's REST settings, seconds for ``--ttl``; elsewhere a unit is required.

The value is exact (:class:`~decimal.Decimal` milliseconds): ``1.1s`` is
1100 ms, not 1100.0000000000002. Anything else raises
:class:`~dstl_client.core.errors.InvalidArgument` naming the value, never
zero. Pure functions, any thread.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal

from dstl_client.core.errors import InvalidArgument

__all__ = ["UNITS_MS", "Duration", "parse_duration"]

#: every unit the parser reads -> its length in milliseconds
UNITS_MS: dict[str, int] = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
    **dict.fromkeys(("w", "week", "weeks"), 604_800_000),
}
_NUMBER = r"(\d{1,15}(?:\.\d{1,9})?)"
_PART = re.compile(rf"\s*{_NUMBER}\s*([a-z]+)\s*")
_BARE = re.compile(rf"\s*{_NUMBER}\s*")
EXAMPLES = "e.g. 500ms, 5s, 1.5h, 10min, 1 minute 30 seconds"


@dataclass(frozen=True, slots=True)
class Duration:
    """A parsed duration: ``ms`` exact milliseconds (never negative)."""

    ms: Decimal

    @property
    def seconds(self) -> float:
        return float(self.ms / 1000)

    @property
    def is_whole_ms(self) -> bool:
        return self.ms == self.ms.to_integral_value()


def parse_duration(
    value: str | int | float,
    *,
    bare_unit: str | None = None,
    units: Collection[str] | None = None,
    what: str = "duration",
) -> Duration:
    """The :class:`Duration` of ``value`` (see the module docs for the syntax).

    ``bare_unit`` (a key of :data:`UNITS_MS`) is what a number without a unit
    means, a number (int or float) included; ``None``: a unit is required.
    ``units`` narrows the unit names accepted (a caller whose values are
    short, e.g. the driver's REST settings, need not take weeks); ``what``
    names the value in the error.
    """
    if bare_unit is not None and bare_unit not in UNITS_MS:
        raise ValueError(f"bare_unit={bare_unit!r} is not a unit")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if bare_unit is None or not math.isfinite(value) or value < 0:
            raise _bad(what, value, "a duration with a unit")
        return Duration(Decimal(str(value)) * UNITS_MS[bare_unit])
    if not isinstance(value, str):
        raise _bad(what, value, "a duration as text")
    body = value.strip().lower().removeprefix("interval").strip()
    bare = _BARE.fullmatch(body)
    if bare is not None:
        if bare_unit is None:
            raise _bad(what, value, "a unit (ms, s, min, h, d, w)")
        return Duration(Decimal(bare.group(1)) * UNITS_MS[bare_unit])
    total = Decimal(0)
    pos = 0
    while pos < len(body):
        m = _PART.match(body, pos)
        if m is None:
            raise _bad(what, value, "a number and a unit")
        unit = UNITS_MS.get(m.group(2)) if units is None or m.group(2) in units else None
        if unit is None:
            raise _bad(what, value, f"unknown unit {m.group(2)!r}")
        total += Decimal(m.group(1)) * unit
        pos = m.end()
    if pos == 0:
        raise _bad(what, value, "a duration")
    return Duration(total)


def _bad(what: str, value: object, expected: str) -> InvalidArgument:
    return InvalidArgument(f"{what} {value!r}: expected {expected}; {EXAMPLES}")
