"""Every Spark SQL type in a processor's input, state (value, list, map) and output, on both engines.

One query per API style (pandas DataFrames / ``Row``\\ s), time mode None,
with one sub-processor per type (:mod:`._type_subs`): each test compares
what one type's sub-processor saw and output. A difference dstl still has
is an ``xfail(strict=True)`` naming the issue item.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.compat import _type_subs as types
from tests.compat._engines import Case, Outcomes
from tests.compat._known import marks
from tests.compat._multiplex import Multiplex, Sub

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

STYLES = {"pandas": True, "rows": False}


def _case(style: str, subs: tuple[Sub, ...], name: str) -> Case:
    use_pandas = STYLES[style]
    return Case(
        name=name,
        processor=lambda: Multiplex(subs, use_pandas, types.output_columns()),
        input_schema=types.input_schema(),
        batches=types.batches(subs),
        output_schema=types.output_schema(),
        use_pandas=use_pandas,
    )


#: a type whose difference ends dstl's query runs in a case of its own, not to hide the others'
ALONE: set[tuple[str, str]] = set()


def case_of(type_name: str, style: str) -> Case:
    if (type_name, style) in ALONE:
        (sub,) = [t for t in types.TYPES if t.name == type_name]
        return _case(style, (sub,), f"types-{style}-{type_name}")
    return CASES[style]


CASES = {
    style: _case(
        style,
        (*(t for t in types.TYPES if (t.name, style) not in ALONE), types.Coerce()),
        f"types-{style}",
    )
    for style in STYLES
}
#: known differences: ``types:<type>`` or ``types:<type>/<style>`` -> the issue item
XFAIL: dict[str, str] = {}


def _params() -> list[Any]:
    out = []
    for t in types.TYPES:
        for style in STYLES:
            mark = marks(XFAIL, f"types:{t.name}", style)
            out.append(pytest.param(t.name, style, marks=mark, id=f"{t.name}-{style}"))
    return out


@pytest.mark.parametrize(("type_name", "style"), _params())
def test_type_gives_sparks_rows(outcomes: Outcomes, type_name: str, style: str) -> None:
    spark_rows, dstl_rows = outcomes.of(case_of(type_name, style)).pair(lambda r: r[1] == type_name)
    assert spark_rows, f"Spark gave no rows for {type_name}: the case tests nothing"
    assert dstl_rows == spark_rows


@pytest.mark.parametrize("style", list(STYLES))
def test_a_value_of_another_type_in_state_is_kept_or_refused_where_spark_stores_null(
    outcomes: Outcomes, style: str
) -> None:
    """The table's deliberate difference (``types:coerce``): per :data:`types.PROBES`, Spark 4.3
    stores null (or converts badly) and dstl keeps the value its field holds exactly or
    refuses it with ``InvalidArgument`` naming the field."""
    spark_rows, dstl_rows = outcomes.of(CASES[style]).pair(lambda r: r[1] == types.Coerce.name)
    spark_outs = sorted(r[3] for batch in spark_rows.values() for r in batch)
    dstl_outs = sorted(r[3] for batch in dstl_rows.values() for r in batch)
    assert spark_outs == types.coerce_outputs("spark")
    assert dstl_outs == types.coerce_outputs("dstl")
