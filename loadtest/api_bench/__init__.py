"""``python -m loadtest.api_bench`` (``make bench-api``): the state API against Spark's own.

The same stateful job (a per-key count and sum of ``v`` in value state, one
output row per key and batch) on the same streaming Parquet input (one file
per micro-batch, ``maxFilesPerTrigger=1``, ``availableNow``), run as:

1. Spark's ``transformWithStateInPandas`` (RocksDB state store provider);
2. Spark's ``applyInPandasWithState`` (``GroupState``; same provider);
3. dstl's ``transform_with_state`` over a real ``dstl-server`` on loopback.

Each batch touches new keys (the state grows batch by batch) and revisits
old ones. Per engine: batch duration (Spark's ``triggerExecution``) and
checkpoint duration (Spark: ``walCommit`` + ``commitOffsets`` + the state
store's ``commitTimeMs``; dstl: ``walCommit`` + ``commitOffsets`` + its own
``checkpointDurationMs``), median / p90 / max, and the checkpoint's first
third against its last third. Goals: dstl at least 10x faster per batch than
``transformWithStateInPandas``; dstl's checkpoint flat in state size.

A Markdown report goes to ``loadtest/reports/api-<UTC time>.md``.
"""
