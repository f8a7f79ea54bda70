"""``python -m loadtest.bounded_bench`` (``make bench-bounded``): sorted mode vs the keyed backend.

(a) A micro-benchmark of ``ValueState`` operations (add, get, update; ops/ms)
    on the single-key backend of sorted mode and on the keyed (streaming)
    backend over its SQLite store, printed next to the figures Flink
    published for FLIP-140 (Java; HEAP, ROCKSDB, SINGLE_KEY).
(b) WordCount in a global window (a count per word over the whole bounded
    input) as PySpark jobs on the same Parquet input: sorted mode
    (``process_bounded``) vs the keyed backend (``process_keyed`` over a real
    sidecar, the input read as one ``availableNow`` batch). Goal: sorted mode
    at least twice as fast.

A Markdown report goes to ``loadtest/reports/bounded-<UTC time>.md``.
"""
