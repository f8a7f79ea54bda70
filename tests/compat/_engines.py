"""One processor, two engines: Spark's own operator and dstl's, on the same input, rows compared.

A :class:`Case` names a processor (a factory: each engine gets its own
instance), its input (one Parquet file per micro-batch, read with
``maxFilesPerTrigger=1`` and ``availableNow``, so both engines see the same
batches), optional SQL expressions that derive typed input columns, the
output schema, the time mode, the initial state and the event time.

:func:`run_spark` runs it through ``transformWithStateInPandas``
(``use_pandas=True``) or ``transformWithState`` (Rows) with Spark's RocksDB
state store; :func:`run_dstl` through
:func:`dstl_client.processor.transform_with_state`. Both collect every
batch's rows with ``foreachBatch`` and return them per batch id as sorted,
plain tuples (:func:`plain`: nested ``Row``\\ s as tuples, lists, dicts).

Batches without output (Spark's batches without data, which fire timers
while the input is idle) are left out of the comparison, so cases are
written such that no timer or TTL is due after the last batch's input.

Thread: the test's thread (each run blocks until its query ends).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: how long one query may run (each case has a handful of tiny batches)
QUERY_TIMEOUT_S = 180

Rows = dict[int, list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Case:
    """One processor and its input; run on both engines by :func:`run_spark` / :func:`run_dstl`.

    Frozen: shared by the test and both runs.
    """

    name: str
    #: a new processor instance (each engine gets its own)
    processor: Callable[[], Any]
    #: the Parquet files' schema (DDL) and rows, one list per micro-batch
    input_schema: str
    batches: Sequence[Sequence[tuple[Any, ...]]]
    output_schema: Any
    key: str = "k"
    #: ``selectExpr`` over the input before grouping (derived, typed columns); none: as is
    select: Sequence[str] = ()
    time_mode: str = "None"
    use_pandas: bool = True
    #: the event-time column and watermark delay (both, or neither)
    event_time_column: str | None = None
    watermark_delay: str | None = None
    #: the initial state: schema (DDL, with the key column) and rows
    initial_schema: str | None = None
    initial_rows: Sequence[tuple[Any, ...]] = field(default_factory=tuple)


def write_input(case: Case, spark: Any, directory: Path) -> None:
    """One Parquet file per batch, oldest first (the file source orders by modification time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    directory.mkdir(parents=True, exist_ok=True)
    struct = StructType.fromDDL(case.input_schema)
    assert isinstance(struct, StructType)
    schema = to_arrow_schema(struct, timezone="UTC")
    base = time.time() - 1000
    for b, rows in enumerate(case.batches):
        table = pa.Table.from_pylist(
            [dict(zip(schema.names, r, strict=True)) for r in rows], schema
        )
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + b, base + b))


def _events(case: Case, spark: Any, directory: Path) -> Any:
    df = (
        spark.readStream.schema(case.input_schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(directory))
    )
    if case.select:
        df = df.selectExpr(*case.select)
    return df


def _initial(case: Case, spark: Any) -> Any:
    if case.initial_schema is None:
        return None
    return spark.createDataFrame(list(case.initial_rows), case.initial_schema).groupBy(case.key)


def _collector(into: Rows) -> Callable[[Any, int], None]:
    def sink(df: Any, batch_id: int) -> None:
        rows = [plain(r) for r in df.collect()]
        if rows:
            into[batch_id] = sorted(rows, key=repr)

    return sink


def run_spark(case: Case, spark: Any, workdir: Path) -> Rows:
    """The case on Spark's own operator (RocksDB state store); rows per batch with output."""
    inputs = workdir / "input"
    if not inputs.exists():
        write_input(case, spark, inputs)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    df = _events(case, spark, inputs)
    if case.event_time_column is not None:
        df = df.withWatermark(case.event_time_column, case.watermark_delay)
    grouped = df.groupBy(case.key)
    operator = grouped.transformWithStateInPandas if case.use_pandas else grouped.transformWithState
    out = operator(
        case.processor(),
        case.output_schema,
        "Update",
        case.time_mode,
        initialState=_initial(case, spark),
    )
    got: Rows = {}
    total = sum(len(b) for b in case.batches)
    done = _InputConsumed(total)
    spark.streams.addListener(done)
    try:
        # no availableNow: in time mode ProcessingTime Spark runs batches without data
        # forever; the query stops once the batch that read the last input row is done
        q = (
            out.writeStream.foreachBatch(_collector(got))
            .option("checkpointLocation", str(workdir / "spark-ckpt"))
            .outputMode("update")
            .start()
        )
        done.watch(str(q.id))
        try:
            done.consumed.wait(QUERY_TIMEOUT_S)
            if done.rows < total:
                raise RuntimeError(
                    f"{case.name}: Spark's query read {done.rows} of {total} rows "
                    f"in {QUERY_TIMEOUT_S} s ({q.exception()})"
                )
        finally:
            q.stop()
    finally:
        spark.streams.removeListener(done)
    assert done.last_batch is not None
    # what batches without data fired after the last input is not compared (dstl has none)
    return {b: rows for b, rows in got.items() if b <= done.last_batch}


class _InputConsumed(StreamingQueryListener):  # type: ignore[misc]
    """Sets :attr:`consumed` once query :attr:`query_id` has read ``total`` input rows (or
    ended). Events of other queries (an earlier query's late ones too) are kept apart.

    Called on Spark's listener thread; :meth:`watch` and the results by the test's.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.consumed = threading.Event()
        self._lock = threading.Lock()
        self._query_id: str | None = None
        self._rows: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._ended: set[str] = set()

    def watch(self, query_id: str) -> None:
        with self._lock:
            self._query_id = query_id
            self._check()

    @property
    def rows(self) -> int:
        with self._lock:
            return self._rows.get(self._query_id or "", 0)

    @property
    def last_batch(self) -> int | None:
        with self._lock:
            return self._last.get(self._query_id or "")

    def _check(self) -> None:
        q = self._query_id
        if q is not None and (self._rows.get(q, 0) >= self.total or q in self._ended):
            self.consumed.set()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        with self._lock:
            if progress.numInputRows > 0:
                qid = str(progress.id)
                self._rows[qid] = self._rows.get(qid, 0) + progress.numInputRows
                self._last[qid] = progress.batchId
            self._check()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        with self._lock:
            self._ended.add(str(event.id))  # failed or stopped: no more rows will come
            self._check()


def run_dstl(case: Case, spark: Any, workdir: Path, address: str) -> Rows:
    """The case on dstl's ``transform_with_state``; rows per batch with output."""
    from dstl_client.processor import transform_with_state

    inputs = workdir / "input"
    if not inputs.exists():
        write_input(case, spark, inputs)
    df = _events(case, spark, inputs)
    got: Rows = {}
    stream = transform_with_state(
        df.groupBy(case.key),
        processor=case.processor(),
        output_schema=case.output_schema,
        output_mode="Update",
        time_mode=case.time_mode,
        use_pandas=case.use_pandas,
        event_time_column=case.event_time_column,
        watermark_delay=case.watermark_delay,
        initial_state=_initial(case, spark),
        parallelism=2,
        max_parallelism=8,
        dstl_address=address,
        state_dir=str(workdir / "dstl-state"),
        job_id=f"compat-{case.name}",
    )
    q = (
        stream.writeStream.foreachBatch(_collector(got))
        .option("checkpointLocation", str(workdir / "dstl-ckpt"))
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.await_termination(QUERY_TIMEOUT_S)
    finally:
        q.stop()
    return got


def plain(value: Any) -> Any:
    """``value`` with ``Row``\\ s as tuples (recursively), NaN as a marker: comparable with ``==``."""
    if isinstance(value, tuple):  # Row is a tuple
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


@dataclass
class Outcome:
    """A case's rows on both engines; ``dstl_error``: why dstl's run failed (``dstl`` empty)."""

    spark: Rows
    dstl: Rows
    dstl_error: BaseException | None = None

    def pair(self, select: Callable[[tuple[Any, ...]], bool] = lambda r: True) -> tuple[Rows, Rows]:
        """``(spark, dstl)``: the selected rows per batch (batches without any left out).

        Raises dstl's error if its run failed: the comparison fails with its cause.
        """
        if self.dstl_error is not None:
            raise self.dstl_error
        return _only(self.spark, select), _only(self.dstl, select)


def _only(rows: Rows, select: Callable[[tuple[Any, ...]], bool]) -> Rows:
    out = {b: [r for r in batch if select(r)] for b, batch in rows.items()}
    return {b: batch for b, batch in out.items() if batch}


class Outcomes:
    """Runs each :class:`Case` once on both engines (first dstl, then Spark) and keeps the rows.

    The test thread only (package-scoped fixture).
    """

    def __init__(self, spark: Any, address: str, workdir: Path) -> None:
        self.spark = spark
        self.address = address
        self.workdir = workdir
        self._done: dict[str, Outcome] = {}
        self._failed: dict[str, Exception] = {}

    def of(self, case: Case) -> Outcome:
        found = self._done.get(case.name)
        if found is not None:
            return found
        failed = self._failed.get(case.name)
        if failed is not None:
            raise RuntimeError(f"{case.name}: Spark's run failed before") from failed
        where = self.workdir / case.name
        dstl: Rows = {}
        error: BaseException | None = None
        try:
            dstl = run_dstl(case, self.spark, where, self.address)
        except Exception as exc:  # kept: every test of the case fails with it
            error = exc
        try:
            spark = run_spark(case, self.spark, where)
        except Exception as exc:  # kept too: every test of the case fails with it
            self._failed[case.name] = exc
            raise
        outcome = Outcome(spark, dstl, error)
        self._done[case.name] = outcome
        return outcome
