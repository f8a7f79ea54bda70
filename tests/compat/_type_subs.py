"""One sub-processor per Spark SQL type: the type in the input, in all three state kinds, in the output.

Each :class:`TypeSub` reads its own input column (``c_<name>``), stores the
value in a value state, twice in a list state and as a map state value (and
key, for atomic types), reads everything back and outputs what it saw:
the Python type of the input value (and the pandas dtype of its column),
the values state gave back, their Python types, field access on nested
structs, and the input value itself in its typed output column.

Time mode None: the input, initial-state and timer values are all about types.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row

from tests.compat._multiplex import DTYPES, OUTPUT_COLUMNS, Sub, deep_py

T0 = datetime.datetime(2024, 1, 1, 12, 30, 15, 123456, tzinfo=datetime.UTC)


class TypeSub(Sub):
    """The type ``ddl`` through input, state and output (see the module documentation)."""

    def __init__(
        self,
        name: str,
        ddl: str,
        value: Any,
        *,
        map_key: bool = True,
        in_state: bool = True,
        in_output: bool = True,
    ) -> None:
        self.name = name
        self.ddl = ddl
        self.value = value
        self.map_key = map_key
        self.in_state = in_state
        self.in_output = in_output
        self.columns = (*OUTPUT_COLUMNS, self.column) if in_output else ()
        self.integral = ddl in ("tinyint", "smallint", "int", "bigint")

    @property
    def column(self) -> str:
        return f"c_{self.name}"

    def init(self, handle: Any) -> None:
        if not self.in_state:
            return
        self.v = handle.getValueState(f"{self.name}_v", f"x {self.ddl}")
        self.l = handle.getListState(f"{self.name}_l", f"x {self.ddl}, i int")
        key = f"x {self.ddl}" if self.map_key else "x string"
        self.m = handle.getMapState(f"{self.name}_m", key, f"x {self.ddl}")

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        out: list[Any] = []
        for r in records:
            raw = r[self.column]
            x = deep_py(raw)
            if self.integral and isinstance(x, float) and x == x:  # not NaN (a null)
                # pandas hands an integer column with nulls as float64 (both engines); a
                # processor casts back (Spark would store a float in an integer field as null)
                x = int(x)
            # a Row's map values are (key, value) pairs on both engines, nested ones too
            # (pyarrow's as_py); state wants dicts (Spark stores pairs as null, dstl refuses)
            x = _pairs_as_dicts(x)
            seen: list[Any] = ["input", _type(raw), _repr(raw), r.get(DTYPES, {}).get(self.column)]
            if self.in_state and not key.endswith(":null"):
                self.v.update((x,))
                self.l.appendValue((x, 1))
                self.l.appendList([(x, 2)])
                mk = x if self.map_key else "k"
                self.m.updateValue((mk,), (x,))
                got = self.v.get()
                listed = list(self.l.get())
                entries = list(self.m.iterator())
                seen += [
                    "value",
                    _repr(got),
                    _type(got),
                    _type(got[0] if got else None),
                    _fields(got[0] if got else None),
                    "list",
                    _repr(listed),
                    [_type(e) for e in listed],
                    "map",
                    _repr(entries),
                    _repr(self.m.getValue((mk,))),
                    self.m.containsKey((mk,)),
                ]
            if self.columns:
                out.append({"seq": 0, "out": repr(seen), self.column: x})
            else:
                out.append(seen)
        return out


def _pairs_as_dicts(value: Any) -> Any:
    """``value`` with every non-empty list of 2-tuples (a map in a ``Row``) as a dict,
    recursively (a struct in a ``Row`` is a dict, so no other list holds tuples here)."""
    if isinstance(value, dict):
        return {k: _pairs_as_dicts(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(e, tuple) and len(e) == 2 for e in value):
            return {k: _pairs_as_dicts(v) for k, v in value}
        return [_pairs_as_dicts(v) for v in value]
    return value


def _type(value: Any) -> str:
    return type(value).__name__


def _repr(value: Any) -> str:
    """``repr`` with ``Row``\\ s and tuples told apart (a ``Row``'s repr names its fields)."""
    return repr(value)


def _fields(value: Any) -> Any:
    """Field access on a struct value: ``asDict()`` and attribute access, if it has them."""
    if hasattr(value, "asDict"):
        return ("asDict", value.asDict(recursive=True))
    return ("no asDict", _type(value))


@dataclass(frozen=True)
class Probe:
    """A value of another Python type than the state field's: what each engine makes of it."""

    label: str
    ddl: str
    #: the value (a factory: NumPy arrays are made afresh in each call)
    value: Callable[[], Any]
    #: what Spark 4.3 stores (``None``: null) and dstl (:data:`REFUSED`: ``InvalidArgument``
    #: naming the field), compared by ``test_types``
    spark: Any
    dstl: Any


REFUSED = "refused"


def _np_structs() -> Any:
    import numpy as np

    return np.array([{"a": 1}], dtype=object)


def _np_float() -> Any:
    import numpy as np

    return np.float64(4.0)


#: Spark 4.3 stores ``null`` for a Python value its JVM side does not expect for the field
#: (and an int's low bits, and an int's text in a string field); dstl keeps a value its
#: field holds exactly and refuses any other (the table's deliberate choice)
PROBES: tuple[Probe, ...] = (
    Probe("float in int", "int", lambda: 1.7, None, REFUSED),
    Probe("whole float in int", "int", lambda: 2.0, None, 2),
    Probe("numpy float in bigint", "bigint", _np_float, None, 4),
    Probe("int in double", "double", lambda: 5, None, 5.0),
    Probe("int in float", "float", lambda: 5, None, 5.0),
    Probe("str in int", "int", lambda: "3", None, REFUSED),
    Probe("int in string", "string", lambda: 5, "5", REFUSED),
    Probe("int beyond int", "int", lambda: 2**40 + 3, 3, REFUSED),
    Probe("int in boolean", "boolean", lambda: 1, None, True),
    Probe("pairs in map", "map<string,int>", lambda: [("a", 1)], None, REFUSED),
    Probe("numpy array in array", "array<struct<a:int>>", _np_structs, [Row(a=1)], [Row(a=1)]),
)


class Coerce(Sub):
    """Each :class:`Probe`'s value into a value state of its field's type, then read back.

    Outputs ``(label, "stored", repr(value read))`` or ``(label, "refused", exception type,
    whether the message names the field)``. No probe makes Spark's state call fail (a
    failed call ends Spark's state connection for the task).
    """

    name = "coerce"

    def init(self, handle: Any) -> None:
        self.states = [
            handle.getValueState(f"coerce_{i}", f"x {p.ddl}") for i, p in enumerate(PROBES)
        ]

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        out: list[Any] = []
        for probe, state in zip(PROBES, self.states, strict=True):
            try:
                state.update((probe.value(),))
            except Exception as exc:  # dstl refuses what its field cannot hold as given
                out.append((probe.label, REFUSED, type(exc).__name__, "field 'x'" in str(exc)))
                continue
            got = state.get()
            out.append((probe.label, "stored", repr(got[0] if got else got)))
        return out


def coerce_outputs(engine: str) -> list[str]:
    """The ``out`` values :class:`Coerce` gives on ``engine`` (``"spark"`` or ``"dstl"``)."""
    outs = []
    for p in PROBES:
        want = getattr(p, engine)
        if want == REFUSED:
            outs.append(repr((p.label, REFUSED, "InvalidArgument", True)))
        else:
            outs.append(repr((p.label, "stored", repr(want))))
    return sorted(outs)


#: name, DDL, a value (the input column ``c_<name>``), options
TYPES: tuple[TypeSub, ...] = (
    TypeSub("bool", "boolean", True),
    TypeSub("byte", "tinyint", -7),
    TypeSub("short", "smallint", 300),
    TypeSub("int", "int", -70_000),
    TypeSub("long", "bigint", 2**40 + 3),
    TypeSub("float", "float", 1.5),
    TypeSub("double", "double", -2.25),
    TypeSub("dec", "decimal(12,3)", decimal.Decimal("123456789.125")),
    TypeSub("str", "string", "héllo"),
    TypeSub("bin", "binary", b"\x00\xffab"),
    TypeSub("date", "date", datetime.date(2024, 2, 29)),
    TypeSub("ts", "timestamp", T0, in_output=False),
    TypeSub("ntz", "timestamp_ntz", T0.replace(tzinfo=None), in_output=False),
    TypeSub("arr", "array<int>", [1, None, 3], map_key=False),
    TypeSub("map", "map<string,int>", {"a": 1, "b": None}, map_key=False),
    TypeSub("struct", "struct<a:int,b:string>", {"a": 1, "b": "x"}, map_key=False),
    TypeSub(
        "nestedmap",
        "struct<m:map<string,int>,a:array<map<string,int>>>",
        {"m": {"x": 1, "y": None}, "a": [{"z": 3}, None]},
        map_key=False,
    ),
    TypeSub(
        "nested",
        "struct<s:struct<x:bigint>,l:array<struct<y:string>>>",
        {"s": {"x": 5}, "l": [{"y": "p"}, {"y": "q"}]},
        map_key=False,
    ),
)


def input_schema() -> str:
    return ", ".join(["k string", *(f"c_{t.name} {t.ddl}" for t in TYPES)])


def output_schema() -> str:
    cols = [f"c_{t.name} {t.ddl}" for t in TYPES if t.in_output]
    return ", ".join(["k string, sub string, seq long, out string", *cols])


def output_columns() -> tuple[str, ...]:
    return (*OUTPUT_COLUMNS, *(f"c_{t.name}" for t in TYPES if t.in_output))


def batches(subs: Sequence[Sub] = TYPES) -> list[list[tuple[Any, ...]]]:
    """One batch: per type of ``subs`` a key with its value and a key with a null, other
    columns null; per other sub-processor of ``subs`` one key, every column null."""
    rows: list[tuple[Any, ...]] = [
        (f"{s.name}:a", *[None] * len(TYPES)) for s in subs if not isinstance(s, TypeSub)
    ]
    for i, t in enumerate(TYPES):
        if t not in subs:
            continue
        for suffix, value in (("1", t.value), ("null", None)):
            row: list[Any] = [f"{t.name}:{suffix}"] + [None] * len(TYPES)
            row[1 + i] = value
            rows.append(tuple(row))
    return [rows]
