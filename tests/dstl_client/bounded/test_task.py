"""Sorted mode's ``mapInArrow`` side without a Spark session: key runs in Arrow, keys crossing
batches, streamed outputs, and the order check on unsorted input."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from dstl_client.batch.columns import RESULT_COLUMNS
from dstl_client.batch.routing import keyed_schemas
from dstl_client.bounded import KeyOrderError
from dstl_client.bounded.task import BoundedTaskSpec, bounded_task, key_pieces, key_runs
from dstl_client.processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from dstl_client.processor.task import INIT_COLUMN
from dstl_client.state.api import KeyedContext
from dstl_client.state.serializers import INT64


def _batch(words: list[Any], values: list[int] | None = None) -> pa.RecordBatch:
    values = values if values is not None else list(range(len(words)))
    return pa.record_batch({"w": words, "v": pa.array(values, pa.int64())})


def test_key_runs_are_found_in_arrow() -> None:
    assert key_runs(_batch(["a", "a", "b", "c", "c", "c"]), "w") == [
        (0, 2, "a"),
        (2, 3, "b"),
        (3, 6, "c"),
    ]
    assert key_runs(_batch(["x"]), "w") == [(0, 1, "x")]
    assert key_runs(_batch([]), "w") == []
    ints = pa.record_batch({"k": pa.array([1, 1, 1], pa.int64())})
    assert key_runs(ints, "k") == [(0, 3, 1)]


def test_a_key_crossing_batches_is_one_key() -> None:
    batches = [_batch(["a", "b"]), _batch(["b", "b"]), _batch([]), _batch(["b", "c"])]
    got = [
        (k, [(p.start, p.end) for p in pieces])
        for k, pieces in key_pieces(iter(batches), "w", lambda rb: None)
    ]
    assert got == [("a", [(0, 1)]), ("b", [(1, 2), (0, 2), (0, 1)]), ("c", [(1, 2)])]


def count(key: Any, rows: list[dict[str, Any]], ctx: KeyedContext) -> Any:
    n = ctx.value_state("n", INT64)
    for r in rows:
        n.update((n.value() or 0) + r["v"])
    yield {"w": key, "n": n.value(), "rows": len(rows)}


def _run(batches: list[pa.RecordBatch], fn: Any = count) -> list[dict[str, Any]]:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schemas = keyed_schemas(  # a StructType: a DDL string needs a JVM to parse
        StructType(
            [
                StructField("w", StringType()),
                StructField("n", LongType()),
                StructField("rows", LongType()),
            ]
        )
    )
    spec = BoundedTaskSpec(key="w", columns=("w", "v"), fn=fn)
    out = list(bounded_task(spec, schemas.arrow, iter(batches)))
    assert all(b.schema == schemas.arrow for b in out)
    rows = pa.Table.from_batches(out, schemas.arrow).drop_columns(list(RESULT_COLUMNS))
    got: list[dict[str, Any]] = rows.to_pylist()
    return got


def test_the_fn_task_streams_sorted_batches_and_matches_a_python_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dstl_client.bounded.task as task

    monkeypatch.setattr(task, "OUT_BATCH_ITEMS", 7)  # several output batches
    words = sorted(f"w{i % 23:02d}" for i in range(500))
    values = list(range(500))
    batches = [_batch(words[i : i + 64], values[i : i + 64]) for i in range(0, 500, 64)]
    got = _run(batches)
    want_n: Counter[str] = Counter()
    want_rows: Counter[str] = Counter()
    for w, v in zip(words, values, strict=True):
        want_n[w] += v
        want_rows[w] += 1
    assert [r["w"] for r in got] == sorted(want_n)
    assert {r["w"]: (r["n"], r["rows"]) for r in got} == {
        w: (want_n[w], want_rows[w]) for w in want_n
    }


def test_unsorted_input_fails_the_task_with_a_clear_error() -> None:
    with pytest.raises(KeyOrderError, match="not sorted by key"):
        _run([_batch(["a", "c"]), _batch(["b"])])
    with pytest.raises(KeyOrderError, match=r"'a' arrived after key 'b'.*seen again"):
        _run([_batch(["a", "b"]), _batch(["b", "a"])])


class Chunks(StatefulProcessor):
    """Counts a key's rows over every DataFrame it gets; the initial state adds to it."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.base = handle.getValueState("base", "n long")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        self.base.update((int(initialState["n"].sum()),))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        import pandas as pd

        frames = list(rows)
        assert all(list(f.index) == list(range(len(f))) for f in frames)
        n = (self.base.get() or (0,))[0] + sum(int(f["v"].sum()) for f in frames)
        yield pd.DataFrame({"w": [key[0]], "n": [n], "rows": [len(frames)]})


def test_the_processor_task_gets_a_keys_chunks_and_its_initial_state_first() -> None:
    from pyspark import cloudpickle
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    init_type = pa.struct([("w", pa.string()), ("n", pa.int64())])

    def batch(rows: list[tuple[str, int | None, tuple[str, int] | None]]) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "w": [w for w, _, _ in rows],
                "v": pa.array([v for _, v, _ in rows], pa.int64()),
                INIT_COLUMN: pa.array(
                    [None if i is None else {"w": i[0], "n": i[1]} for _, _, i in rows],
                    init_type,
                ),
            }
        )

    # sorted by key, a key's initial state first; "b" spans three batches, "c" is initial only
    batches = [
        batch([("a", 1, None), ("b", None, ("b", 100))]),
        batch([("b", None, ("b", 5)), ("b", 2, None)]),
        batch([("b", 3, None), ("c", None, ("c", 9)), ("d", 4, None)]),
    ]
    schemas = keyed_schemas(
        StructType(
            [
                StructField("w", StringType()),
                StructField("n", LongType()),
                StructField("rows", LongType()),
            ]
        )
    )
    spec = BoundedTaskSpec(
        key="w",
        columns=("w", "v"),
        processor=cloudpickle.dumps(Chunks()),  # type: ignore[no-untyped-call]
        initial_columns=("w", "n"),
    )
    out = list(bounded_task(spec, schemas.arrow, iter(batches)))
    got = pa.Table.from_batches(out, schemas.arrow).drop_columns(list(RESULT_COLUMNS))
    assert got.to_pylist() == [
        {"w": "a", "n": 1, "rows": 1},
        {"w": "b", "n": 110, "rows": 2},  # one DataFrame per batch the key's input was in
        {"w": "d", "n": 4, "rows": 1},
    ]
