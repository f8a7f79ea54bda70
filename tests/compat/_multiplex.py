"""Many small processors in one query: :class:`Multiplex` dispatches each key to its sub-processor.

A Spark query costs seconds per batch, so the suite runs each time mode once
with every sub-processor of that mode inside one ``StatefulProcessor``. A
key is ``"<sub>:<name>"``: :class:`Multiplex` hands the key's input,
initial state and timers to the sub-processor named before the colon.
Every sub-processor declares its own state names (prefixed with its name)
in the shared ``init``.

Sub-processors (:class:`Sub`) see plain records (``dict``\\ s of Python
values) whichever API style the query uses, and return output records
``(out, ...)``: :class:`Multiplex` converts pandas DataFrames or ``Row``\\ s
in and out, so the same sub-processor runs in ``transformWithStateInPandas``
and ``transformWithState`` style. Each output row is ``(k, sub, seq, out)``
(``seq``: the position among the call's outputs, ``out`` a ``repr`` of what
the sub-processor observed), or the typed columns a :class:`Sub` with its
own :attr:`Sub.columns` fills.

Both engines call these methods from one task thread per partition.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor

#: the output schema of a multiplexed query without typed columns
OUTPUT_SCHEMA = "k string, sub string, seq long, out string"
OUTPUT_COLUMNS = ("k", "sub", "seq", "out")
#: in pandas style, each record's ``{column: dtype}`` of the DataFrame it came from
DTYPES = "_dtypes"


def py(value: Any) -> Any:
    """A NumPy scalar as its Python value; anything else (arrays too) as is."""
    if type(value).__module__.startswith("numpy") and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def deep_py(value: Any) -> Any:
    """``value`` with NumPy arrays as lists and NumPy scalars as Python values, recursively
    (what pandas hands over for array, map and struct columns, made storable)."""
    if type(value).__module__.startswith("numpy"):
        return deep_py(value.tolist()) if getattr(value, "ndim", 0) else value.item()
    if isinstance(value, dict):
        return {k: deep_py(v) for k, v in value.items()}
    if isinstance(value, list | tuple) and not hasattr(value, "asDict"):
        return type(value)(deep_py(v) for v in value)
    return value


class Sub:
    """One sub-processor: the methods of a ``StatefulProcessor`` on plain records.

    ``records`` are the key's input rows as dicts (pandas values as Python
    values, and under :data:`DTYPES` the pandas dtypes); each returned item is one output row's ``out`` value (any
    ``repr``-able value) or, with :attr:`columns`, a dict of those columns.
    """

    #: the key prefix that selects it
    name = ""
    #: its own output columns, or empty for ``(k, sub, seq, out)``
    columns: tuple[str, ...] = ()

    def init(self, handle: Any) -> None:
        pass

    def rows(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> Sequence[Any]:
        return []

    def timer(self, key: str, timerValues: Any, expiredTimerInfo: Any) -> Sequence[Any]:
        return []

    def initial(self, key: str, records: list[dict[str, Any]], timerValues: Any) -> None:
        pass


class Multiplex(StatefulProcessor):  # type: ignore[misc]
    """Spark's ``StatefulProcessor`` (Spark's own base class) over :class:`Sub`\\ s.

    ``use_pandas``: DataFrames in and out (``transformWithStateInPandas``),
    else ``Row``\\ s (``transformWithState``). ``columns``: the query's output
    columns (a :class:`Sub` without its own gets ``(k, sub, seq, out)``,
    the other columns null).
    """

    def __init__(
        self, subs: Sequence[Sub], use_pandas: bool, columns: Sequence[str] = OUTPUT_COLUMNS
    ) -> None:
        self.subs = {s.name: s for s in subs}
        assert len(self.subs) == len(subs), "sub-processor names must differ"
        self.use_pandas = use_pandas
        self.columns = tuple(columns)

    def init(self, handle: Any) -> None:
        for sub in self.subs.values():
            sub.init(handle)

    def _sub(self, key: Any) -> tuple[str, Sub]:
        k = str(key[0])
        return k, self.subs[k.split(":", 1)[0]]

    def _records(self, rows: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.use_pandas:
            for pdf in rows:
                dtypes = {c: str(t) for c, t in pdf.dtypes.items()}
                out.extend(
                    {c: py(v) for c, v in zip(pdf.columns, t, strict=True)} | {DTYPES: dtypes}
                    for t in pdf.itertuples(index=False, name=None)
                )
        else:
            out.extend(r.asDict() for r in rows)
        return out

    def _emit(self, k: str, sub: Sub, outs: Sequence[Any]) -> Iterator[Any]:
        records = []
        for seq, o in enumerate(outs):
            if sub.columns:
                records.append({c: o.get(c) for c in self.columns} | {"k": k, "sub": sub.name})
            else:
                record = dict.fromkeys(self.columns)
                record.update(k=k, sub=sub.name, seq=seq, out=repr(o))
                records.append(record)
        if not records:
            return
        if self.use_pandas:
            import pandas as pd

            # one DataFrame per output row: several frames per call, as Spark allows
            for r in records:
                yield pd.DataFrame({c: [r[c]] for c in self.columns})
        else:
            from pyspark.sql import Row

            for r in records:
                yield Row(**r)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        k, sub = self._sub(key)
        records = sorted(self._records(rows), key=repr)  # row order within a key is not fixed
        yield from self._emit(k, sub, sub.rows(k, records, timerValues))

    def handleExpiredTimer(
        self, key: Any, timerValues: Any, expiredTimerInfo: Any
    ) -> Iterator[Any]:
        k, sub = self._sub(key)
        yield from self._emit(k, sub, sub.timer(k, timerValues, expiredTimerInfo))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        k, sub = self._sub(key)
        records = self._records([initialState] if self.use_pandas else iter([initialState]))
        sub.initial(k, records, timerValues)

    def close(self) -> None:
        pass
