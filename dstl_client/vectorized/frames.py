"""The tables the user's function sees and returns: Arrow or pandas, checked per batch.

``frame="arrow"``: ``pyarrow.Table`` in and out (no pandas anywhere);
``frame="pandas"``: ``DataFrame``\\ s in (``Table.to_pandas()``), and either
kind accepted back. What comes back is checked against the columns it must
have (:func:`table_of`): a missing column, or one whose values do not cast
to its type, raises :class:`~dstl_client.core.errors.InvalidArgument` naming
the table and the column; extra columns are ignored. Pure functions: any thread.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from dstl_client.core.errors import InvalidArgument

FRAMES = ("arrow", "pandas")


def to_frame(table: pa.Table, frame: str) -> Any:
    """``table`` as the function gets it."""
    return table if frame == "arrow" else table.to_pandas()


def table_of(value: Any, what: str, fields: list[pa.Field]) -> pa.Table | None:
    """``value`` (a Table, RecordBatch or pandas DataFrame; ``None``: nothing) with exactly
    ``fields``, cast; raises :class:`InvalidArgument` naming ``what`` and the column."""
    if value is None:
        return None
    if isinstance(value, pa.RecordBatch):
        value = pa.Table.from_batches([value])
    elif not isinstance(value, pa.Table):
        if not (hasattr(value, "columns") and hasattr(value, "iloc")):
            raise InvalidArgument(
                f"BatchOutput.{what} is a {type(value).__name__}: return a pyarrow.Table "
                "or a pandas DataFrame"
            )
        try:
            value = pa.Table.from_pandas(value, preserve_index=False)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise InvalidArgument(f"BatchOutput.{what}: not convertible to Arrow ({exc})") from None
    columns = []
    for f in fields:
        if f.name not in value.column_names:
            raise InvalidArgument(
                f"BatchOutput.{what} has no column {f.name!r} (it needs {[x.name for x in fields]})"
            )
        col = value.column(f.name)
        try:
            col = col.cast(f.type)
        except (pa.ArrowException, ValueError) as exc:
            raise InvalidArgument(
                f"BatchOutput.{what}: column {f.name!r} is {col.type}, not castable to "
                f"{f.type} ({exc})"
            ) from None
        if not f.nullable and col.null_count:
            raise InvalidArgument(f"BatchOutput.{what}: column {f.name!r} holds nulls")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))
