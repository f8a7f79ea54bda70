"""``python -m loadtest.api_bench`` (``make bench-api``): the state APIs against Spark's own.

The same stateful job (issue 20's reference job: a per-key count and sum of
``v`` in state, one output row per key and batch) on the same streaming
Parquet input (one file per micro-batch, ``maxFilesPerTrigger=1``,
``availableNow``), run as (``--engines``, in this order):

- ``tws``: Spark's ``transformWithStateInPandas`` (RocksDB, changelog checkpointing);
- ``apply``: Spark's ``applyInPandasWithState`` (same provider; not in the presets);
- ``dstl``: dstl's per-key processor ``transform_with_state`` over a ``dstl-server``;
- ``vec``: dstl's vectorized ``transform_batches`` (one call per task and batch);
- ``jvm``: Spark's own ``groupBy("k").agg(count, sum)`` in update mode (the ceiling).

Each engine runs in its own process (:mod:`.engine`): its own Spark session
and, for dstl, its own sidecar. Per engine: batch duration (Spark's
``triggerExecution``) median / p90, keys per second, checkpoint duration
(Spark: ``walCommit`` + ``commitOffsets`` + the state store's ``commitTimeMs``;
dstl: the same logs + its own ``checkpointDurationMs``) and its first third
against its last third. PASS/MISS against the goals of :mod:`.config`.
``--preset large`` reaches 1 M keys at 100 k rows per batch.

The report goes to ``loadtest/reports/api-<UTC time>.md``, with a ``.json``
and a ``.png`` beside it.
"""
