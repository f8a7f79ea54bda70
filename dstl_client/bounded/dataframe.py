"""``process_bounded``: a keyed function or processor over a *bounded* DataFrame, in sorted mode.

::

    from dstl_client.bounded import process_bounded

    counts = process_bounded(spark.read.parquet("/data/words"), key="word",
                             fn=count_words, output_schema="word string, n long")
    counts.write.parquet("/out/counts")

The same ``fn(key, rows, ctx)`` as :func:`~dstl_client.spark.process_keyed`,
or the same ``StatefulProcessor`` as
:func:`~dstl_client.processor.transform_with_state`, runs without a sidecar,
a store, a changelog or checkpoints (Flink's FLIP-140, sorted inputs for
BATCH mode): rows with a key are ``repartition``\\ ed by the key,
``sortWithinPartitions`` by the key (then the event time and ``order_by``
columns; Spark's sort spills to disk), and each partition streams through
:mod:`.task`, one key at a time over a single-key backend (:mod:`.runner`).
The result is a DataFrame (lazy, like any), not a streaming query.

Differences from the streaming modes, all following from "each key once, at
the end of the input" (see :mod:`.runner`): a key's timers fire when its
input ends, all of them, in timestamp order (watermark +infinity); input
handlers see the watermark ``-1``; the processing time is one instant (the
driver's clock when called, or ``processing_time_ms``); no row is late.
Within a key, rows come in event-time (then ``order_by``) order if given,
else in no particular order.

:func:`sorted_mode` picks the mode from ``df.isStreaming`` (``"auto"``) or
an explicit ``execution_mode``. Driver side: the caller's thread.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from dstl_client.batch.columns import RESULT_COLUMNS
from dstl_client.batch.inputs import check_reserved, grouping, key_kind
from dstl_client.batch.options import KeyedOptions
from dstl_client.batch.routing import keyed_schemas
from dstl_client.bounded.runner import BOUNDED_BATCH_ID
from dstl_client.bounded.task import BoundedTaskSpec, bounded_task
from dstl_client.core.errors import ConfigError
from dstl_client.extras import require_spark
from dstl_client.keywords import check_keywords
from dstl_client.processor.arguments import initial_rows, time_mode_arg
from dstl_client.processor.declarations import check_processor
from dstl_client.processor.task import INIT_COLUMN
from dstl_client.state.subtask import KeyedFunction

#: ``execution_mode`` values: from ``df.isStreaming``, or forced
EXECUTION_MODES = ("auto", "sorted", "streaming")


def sorted_mode(data: Any, execution_mode: str = "auto") -> bool:
    """Whether ``data`` (a DataFrame or its ``groupBy``) runs in sorted mode.

    ``"auto"``: a bounded DataFrame does (``not df.isStreaming``), a stream
    does not. ``"sorted"`` needs a bounded DataFrame, ``"streaming"`` a
    streaming one (:class:`ConfigError` otherwise: a stream never ends, so it
    cannot be sorted; a bounded DataFrame has no ``writeStream``).
    """
    mode = str(execution_mode).lower()
    if mode not in EXECUTION_MODES:
        raise ConfigError(f"execution_mode={execution_mode!r}: use one of {EXECUTION_MODES}")
    df = getattr(data, "_df", data)  # GroupedData keeps its DataFrame there
    streaming = bool(df.isStreaming)
    if mode == "auto":
        return not streaming
    if mode == "sorted":
        if streaming:
            raise ConfigError(
                "execution_mode='sorted' needs a bounded DataFrame (spark.read...): "
                "a stream never ends, so it cannot be sorted"
            )
        return True
    if not streaming:
        raise ConfigError(
            "execution_mode='streaming' needs a streaming DataFrame (spark.readStream...); "
            "for a bounded one use 'sorted' (or 'auto')"
        )
    return False


def _parallelism(
    parallelism: int | None, config: KeyedOptions | None, options: dict[str, Any]
) -> int | None:
    """The partitions to sort into: explicit, else the streaming options' ``parallelism``.

    The streaming query's other options (``checkpoint_dir``, ``dstl_address``...)
    are accepted and have nothing to do here; an unknown keyword raises
    :class:`TypeError`, as for ``process_keyed``.
    """
    check_keywords("process_bounded", options, KeyedOptions)
    if parallelism is None:
        parallelism = options.get("parallelism", config.parallelism if config else None)
    if parallelism is not None and (
        isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1
    ):
        raise ConfigError(f"parallelism={parallelism!r}: a positive int")
    return parallelism


def process_bounded(
    data: Any,
    *,
    key: str | None = None,
    fn: KeyedFunction | None = None,
    processor: Any = None,
    output_schema: Any = None,
    parallelism: int | None = None,
    order_by: Sequence[str] = (),
    time_mode: str = "None",
    event_time_column: str | None = None,
    use_pandas: bool = True,
    initial_state: Any = None,
    processing_time_ms: int | None = None,
    sink: Callable[[Any, int], None] | None = None,
    config: KeyedOptions | None = None,
    **options: Any,
) -> Any:
    """Run ``fn(key, rows, ctx)`` or ``processor`` per key of a bounded DataFrame, sorted mode.

    ``data``: a bounded DataFrame with the string or integer column ``key``
    (rows with a null key are dropped), or its ``groupBy(key)``. Exactly one
    of ``fn`` (as for ``process_keyed``: rows are dicts of the input columns,
    ``ctx`` a :class:`~dstl_client.state.KeyedContext`) and ``processor`` (as
    for ``transform_with_state``: ``time_mode``, ``use_pandas``,
    ``initial_state``, ``event_time_column``). Output rows are of
    ``output_schema`` (``StructType`` or DDL).

    ``parallelism``: partitions to sort into (default: the ``parallelism``
    of ``config``/``options`` if given, else ``spark.sql.shuffle.partitions``).
    ``order_by``: columns that order a key's rows after the event time.
    ``sink(df, 0)``, if given, gets the result once (as ``process_keyed``'s
    sink gets a batch). The streaming query's options are accepted and,
    but for ``parallelism``, unused.

    Returns the output DataFrame (lazy: nothing runs until an action).
    """
    require_spark("process_bounded")
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    if (fn is None) == (processor is None):
        raise ConfigError("give exactly one of fn=... and processor=...")
    df, key = grouping(data, key)
    if df.isStreaming:
        raise ConfigError(
            "process_bounded needs a bounded DataFrame: a stream never ends, so it cannot "
            "be sorted (use process_keyed or transform_with_state)"
        )
    n_parts = _parallelism(parallelism, config, options)
    kind = key_kind(df, key)
    check_reserved(df.columns, (INIT_COLUMN,))
    mode = time_mode_arg(time_mode)
    sort_columns = [*([event_time_column] if event_time_column else []), *order_by]
    for column in sort_columns:
        if column not in df.columns:
            raise ConfigError(f"column {column!r} to order a key's rows by is not in {df.columns}")
    if fn is not None and (mode != "None" or initial_state is not None):
        raise ConfigError(
            "fn(key, rows, ctx) has no timers or initial state: use a processor for those"
        )
    schemas = keyed_schemas(output_schema)
    columns = tuple(df.columns)
    rows = df.where(F.col(key).isNotNull())
    init_first: list[Any] = []
    initial_columns = None
    if processor is not None:
        check_processor(processor, mode)
        initial_df, initial_columns, init_type = initial_rows(initial_state, key, df)
        if initial_df is not None:
            rows = rows.withColumn(INIT_COLUMN, F.lit(None).cast(init_type)).unionByName(
                initial_df.where(F.col(key).isNotNull()), allowMissingColumns=True
            )
            # a key's initial state sorts before its input (False < True)
            init_first = [F.col(INIT_COLUMN).isNull()]
    spec = BoundedTaskSpec(
        key=key,
        columns=columns,
        fn=fn,
        processor=None if processor is None else cloudpickle.dumps(processor),  # type: ignore[no-untyped-call]
        time_mode=mode,
        processing_ms=(
            int(time.time() * 1000) if processing_time_ms is None else int(processing_time_ms)
        ),
        use_pandas=use_pandas,
        timezone=df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC",
        initial_columns=initial_columns,
        key_kind=kind,
    )
    routed = (
        rows.repartition(F.col(key)) if n_parts is None else rows.repartition(n_parts, F.col(key))
    )
    ordered = routed.sortWithinPartitions(
        F.col(key), *init_first, *[F.col(c) for c in sort_columns]
    )
    task = functools.partial(bounded_task, spec, schemas.arrow)
    out = ordered.mapInArrow(task, schemas.mapped).drop(*RESULT_COLUMNS)
    if sink is not None:
        sink(out, BOUNDED_BATCH_ID)
    return out
