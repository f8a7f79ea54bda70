"""The checks of a keyed query's input DataFrame, shared under every API.

``process_keyed``, ``process_chain``, ``transform_with_state`` and the sorted
mode all take a DataFrame (or its ``groupBy``) and a key column, and all
reserve the columns their tasks add (:mod:`.columns`). Each check raises
:class:`~dstl_client.core.errors.ConfigError` naming what is wrong. Called
on the driver (the user's thread).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dstl_client.batch.columns import RESERVED_COLUMNS
from dstl_client.core.errors import ConfigError


def check_key_column(df: Any, key: str) -> None:
    """``key`` must be a column of ``df``."""
    if key not in df.columns:
        raise ConfigError(f"key column {key!r} is not in {df.columns}")


def check_reserved(columns: Iterable[str], extra: Iterable[str] = ()) -> None:
    """None of ``columns`` may be a name the tasks add (:data:`RESERVED_COLUMNS`, ``extra``)."""
    names = set(columns)
    for reserved in (*RESERVED_COLUMNS, *extra):
        if reserved in names:
            raise ConfigError(f"column name {reserved!r} is reserved")


def grouping(data: Any, key: str | None) -> tuple[Any, str]:
    """The DataFrame and key column of ``data`` (a DataFrame, or its ``groupBy(key)``)."""
    from pyspark.sql import GroupedData

    if not isinstance(data, GroupedData):
        if not key:
            raise ConfigError("give the grouping column: key=..., or pass df.groupBy(column)")
        return data, key
    try:
        exprs = data._jgd.groupingExprs()
        names = [exprs.apply(i).name() for i in range(exprs.size())]
    except Exception as exc:
        raise ConfigError(
            f"cannot read the grouping columns ({exc}): pass the DataFrame and key="
        ) from None
    if len(names) != 1:
        raise ConfigError(f"group by one column, not {names}")
    if key and key != names[0]:
        raise ConfigError(f"key={key!r} but the data is grouped by {names[0]!r}")
    return data._df, names[0]


def key_kind(df: Any, key: str) -> str:
    """``"string"`` or ``"integer"``: the type of ``df``'s key column (others are refused)."""
    from pyspark.sql import types as T

    check_key_column(df, key)
    dtype = df.schema[key].dataType
    if isinstance(dtype, T.StringType):
        return "string"
    if isinstance(dtype, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return "integer"
    raise ConfigError(f"key column {key!r} is {dtype.simpleString()}: use a string or integer key")
