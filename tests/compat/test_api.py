"""Every method of Spark's state API, run by Spark and by dstl on the same input, rows compared.

One query per API style (pandas DataFrames / ``Row``\\ s), time mode
ProcessingTime, with every sub-processor of :mod:`._api_subs` multiplexed
(:mod:`._multiplex`); each test compares one sub-processor's rows, batch by
batch. A difference dstl still has is an ``xfail(strict=True)`` naming the
issue item: the test turns red once dstl gives Spark's rows.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.compat import _api_subs as api
from tests.compat._engines import Case, Outcomes
from tests.compat._known import marks
from tests.compat._multiplex import OUTPUT_SCHEMA, Multiplex

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

STYLES = {"pandas": True, "rows": False}


def _case(style: str) -> Case:
    use_pandas = STYLES[style]
    return Case(
        name=f"api-{style}",
        processor=lambda: Multiplex([s() for s in api.SUBS], use_pandas),
        input_schema=api.INPUT_SCHEMA,
        batches=api.batches(),
        output_schema=OUTPUT_SCHEMA,
        time_mode="ProcessingTime",
        use_pandas=use_pandas,
        initial_schema=api.INITIAL_SCHEMA,
        initial_rows=api.INITIAL_ROWS,
    )


CASES = {style: _case(style) for style in STYLES}
#: known differences: ``api:<sub>`` or ``api:<sub>/<style>`` -> the issue item (see ``_known``)
XFAIL: dict[str, str] = {}


def _params() -> list[Any]:
    return [
        pytest.param(
            s.name, style, marks=marks(XFAIL, f"api:{s.name}", style), id=f"{s.name}-{style}"
        )
        for s in api.SUBS
        for style in STYLES
    ]


@pytest.mark.parametrize(("sub", "style"), _params())
def test_state_api_gives_sparks_rows(outcomes: Outcomes, style: str, sub: str) -> None:
    spark_rows, dstl_rows = outcomes.of(CASES[style]).pair(lambda r: r[1] == sub)
    assert spark_rows, f"Spark gave no rows for {sub}: the case tests nothing"
    assert dstl_rows == spark_rows
