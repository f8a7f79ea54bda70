"""``docs/spark-compatibility.md`` cannot go stale: checked against pyspark and the suite.

* every public method of pyspark's ``StatefulProcessor``, ``StatefulProcessorHandle``,
  ``ValueState``, ``ListState``, ``MapState``, ``TimerValues`` and ``ExpiredTimerInfo``
  (read from pyspark's own source) and every concrete Spark SQL type has a row;
* every row's status is one of :data:`STATUSES`;
* every compat test a row names exists (``api:<sub>``, ``types:<type>``, ``event:<sub>``);
* a ``supported`` row names at least one test and none that is a known difference
  (``xfail``); a row naming a known difference says ``differs`` and the issue item.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "spark-compatibility.md"
STATUSES = ("supported", "differs", "not supported", "not in Spark", "untested")
API_CLASSES = (
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "ValueState",
    "ListState",
    "MapState",
    "TimerValues",
    "ExpiredTimerInfo",
)
#: abstract DataType classes of pyspark.sql.types (no value has exactly this type)
ABSTRACT_TYPES = {
    "DataType",
    "AtomicType",
    "NumericType",
    "IntegralType",
    "FractionalType",
    "DatetimeType",
    "AnyTimeType",
    "SpatialType",
    "AnsiIntervalType",
}
_ROW = re.compile(r"^\|\s*`([^`]+)`[^|]*\|\s*([^|]+?)\s*\|([^|]*)\|([^|]*)\|\s*$")
_REF = re.compile(r"`((?:api|types|event):[a-z0-9]+)`")


def table_rows() -> dict[str, tuple[str, str, list[str]]]:
    """``{name: (status, notes, test refs)}`` of every table row whose first cell is code."""
    rows: dict[str, tuple[str, str, list[str]]] = {}
    for line in DOC.read_text().splitlines():
        m = _ROW.match(line)
        if m is None:
            continue
        name, status, notes, tests = m.groups()
        assert name not in rows, f"two rows for {name}"
        rows[name] = (status.strip(), notes.strip(), _REF.findall(tests))
    return rows


def spark_api_methods() -> set[str]:
    """``Class.method`` of every public method in pyspark's ``stateful_processor.py``."""
    from pyspark.sql.streaming import stateful_processor

    tree = ast.parse(Path(inspect.getfile(stateful_processor)).read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in API_CLASSES:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and not f.name.startswith("_"):
                    found.add(f"{node.name}.{f.name}")
    assert {m.split(".")[0] for m in found} == set(API_CLASSES)
    return found


def spark_types() -> set[str]:
    from pyspark.sql import types as T

    return {
        name
        for name, cls in vars(T).items()
        if inspect.isclass(cls) and issubclass(cls, T.DataType) and name not in ABSTRACT_TYPES
    }


def compat_tests() -> dict[str, str | None]:
    """Every test reference of the suite, with its known difference (``None``: none)."""
    from tests.compat import (
        _api_subs,
        _event_subs,
        _type_subs,
        test_api,
        test_event_time,
        test_types,
    )

    refs: dict[str, str | None] = {}
    for prefix, names, known in (
        ("api", [s.name for s in _api_subs.SUBS], test_api.XFAIL),
        ("types", [t.name for t in _type_subs.TYPES] + [_type_subs.Coerce.name], test_types.XFAIL),
        ("event", [s.name for s in _event_subs.SUBS] + ["tsout"], test_event_time.XFAIL),
    ):
        for name in names:
            ref = f"{prefix}:{name}"
            reasons = [r for k, r in known.items() if k == ref or k.startswith(ref + "/")]
            refs[ref] = "; ".join(reasons) or None
    return refs


def test_every_api_method_and_type_has_a_row() -> None:
    rows = table_rows()
    missing = sorted((spark_api_methods() | spark_types()) - set(rows))
    assert not missing, f"no row in {DOC.name} for {missing}"


@pytest.mark.parametrize("name", sorted(table_rows()))
def test_a_row_agrees_with_the_suite(name: str) -> None:
    status, notes, refs = table_rows()[name]
    tests = compat_tests()
    assert status in STATUSES, f"{name}: status {status!r}"
    unknown = [r for r in refs if r not in tests]
    assert not unknown, f"{name} names tests the suite does not have: {unknown}"
    known = {r: tests[r] for r in refs if tests[r] is not None}
    if status == "supported":
        assert refs, f"{name} is supported: name the compat test that shows it"
        assert not known, f"{name} is supported but its tests are known to differ: {known}"
    for ref, reason in known.items():
        assert status == "differs", f"{name}: {ref} is a known difference ({reason})"
        item = re.search(r"issue \d+ item \d+", reason or "")
        assert item is None or item.group(0) in notes, f"{name}: say {item.group(0)}"
