"""``transform_batches``: a vectorized stateful function over a streaming DataFrame.

::

    from dstl_client.vectorized import BatchInput, BatchOutput, transform_batches

    def count_sum(batch: BatchInput) -> BatchOutput:
        agg = batch.rows.group_by("k").aggregate([("v", "count"), ("v", "sum")])
        ...
        return BatchOutput(output=new, upserts=new)

    q = (transform_batches(events, key="k", fn=count_sum,
                           state_schema="count long, total long",
                           output_schema="k long, count long, total long",
                           parallelism=4, dstl_address="unix:///var/run/dstl/dstl.sock")
         .writeStream.format("parquet")
         .option("checkpointLocation", "/ckpt/counts")
         .start("/out/counts"))

The arguments are checked here and the operator planned
(:class:`~.driver.VectorPlan`); the query starts when the output is written
(:func:`~.driver.start_query`), on the same batch cycle, checkpoints,
restore and rescale as ``transform_with_state``. The user's function runs
once per task and micro-batch (:mod:`.runner`).
"""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa

from dstl_client.batch.columns import user_arrow_fields
from dstl_client.batch.inputs import check_reserved, grouping, key_kind
from dstl_client.batch.options import KeyedOptions
from dstl_client.batch.routing import keyed_schemas
from dstl_client.core.errors import ConfigError
from dstl_client.extras import require_spark
from dstl_client.keywords import check_keywords
from dstl_client.processor.arguments import time_mode_arg, with_event_time
from dstl_client.processor.writer import ProcessorStream
from dstl_client.vectorized.api import PRESENT, BatchFunction
from dstl_client.vectorized.driver import VectorPlan, start_query
from dstl_client.vectorized.frames import FRAMES
from dstl_client.vectorized.keys import KG_COLUMN
from dstl_client.vectorized.spec import VectorSpec
from dstl_client.vectorized.values import check_state_schema

LATE_ROWS = ("drop", "pass")


def transform_batches(
    data: Any,
    *,
    key: str | list[str] | None = None,
    fn: BatchFunction,
    state_schema: Any,
    output_schema: Any,
    frame: str = "arrow",
    time_mode: str = "None",
    event_time_column: str | None = None,
    watermark_delay: str | None = None,
    state_ttl_ms: int | None = None,
    late_rows: str = "drop",
    config: KeyedOptions | None = None,
    **options: Any,
) -> ProcessorStream:
    """Run ``fn(BatchInput) -> BatchOutput`` once per task and micro-batch, with keyed state.

    ``data``: a streaming DataFrame with the key column ``key`` (a string or
    integer column; one name, or a list of one), or ``df.groupBy(key)``.
    ``state_schema`` (``StructType`` or DDL): one row of state per key
    (booleans, integers, floats, dates, timestamps, strings, binaries);
    ``output_schema``: the rows ``fn`` emits. ``frame``: ``"arrow"``
    (``pyarrow.Table``) or ``"pandas"``. ``time_mode``, ``event_time_column``,
    ``watermark_delay`` and ``late_rows`` as for ``transform_with_state``;
    ``state_ttl_ms``: a key's state row expires that long after its last
    upsert (processing time; needs time mode ProcessingTime or EventTime).
    ``config`` and the keyword ``options`` are the query's
    :class:`~dstl_client.batch.options.KeyedOptions` (``parallelism``,
    ``checkpoint_dir``, ``dstl_address``...). Returns the output, to be
    written with ``.writeStream`` as ``transform_with_state``'s.
    """
    require_spark("transform_batches")
    from pyspark import cloudpickle
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    check_keywords("transform_batches", options, KeyedOptions)
    if isinstance(key, list | tuple):
        if len(key) != 1:
            raise ConfigError(f"key={key!r}: one key column (a list of several is not supported)")
        key = key[0]
    mode = time_mode_arg(time_mode)
    df, key = grouping(data, key)
    if not df.isStreaming:
        raise ConfigError("transform_batches needs a streaming DataFrame")
    df = with_event_time(df, mode, event_time_column, watermark_delay)
    key_kind(df, key)
    check_reserved(df.columns, (KG_COLUMN,))
    if frame not in FRAMES:
        raise ConfigError(f"frame={frame!r}: use one of {FRAMES}")
    if late_rows not in LATE_ROWS:
        raise ConfigError(f"late_rows={late_rows!r}: use one of {LATE_ROWS}")
    if state_ttl_ms is not None:
        if isinstance(state_ttl_ms, bool) or not isinstance(state_ttl_ms, int) or state_ttl_ms <= 0:
            raise ConfigError(f"state_ttl_ms={state_ttl_ms!r}: a positive int")
        if mode == "None":
            raise ConfigError("state_ttl_ms needs time mode ProcessingTime or EventTime")
    if not callable(fn):
        raise ConfigError("fn must be a function of a BatchInput")
    session = df.sparkSession
    zone = session.conf.get("spark.sql.session.timeZone") or "UTC"
    state_struct: Any = (
        StructType.fromDDL(state_schema) if isinstance(state_schema, str) else state_schema
    )
    state = to_arrow_schema(state_struct, timezone=zone)
    check_state_schema(state)
    clash = {key, PRESENT} & set(state.names)
    if clash:
        raise ConfigError(f"state_schema may not name {sorted(clash)} (the key, or the mask)")
    schemas = keyed_schemas(output_schema, zone)
    spec = VectorSpec(
        key=key,
        input_schema=to_arrow_schema(df.schema, timezone=zone),
        state_schema=state,
        output_schema=pa.schema(user_arrow_fields(schemas.arrow)),
        frame=frame,
        time_mode=mode,
        event_time_column=event_time_column,
        late_rows=late_rows,
        ttl_ms=state_ttl_ms,
    )
    plan = VectorPlan(
        spec=spec,
        fn=cloudpickle.dumps(fn),  # type: ignore[no-untyped-call]
        schemas=schemas,
        source=df,
        options=dict(options),
        config=config,
    )
    return ProcessorStream(functools.partial(start_query, plan), schemas.user, "update")
