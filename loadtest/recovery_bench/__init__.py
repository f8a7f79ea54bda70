"""``python -m loadtest.recovery_bench`` (``make bench-recovery``): how fast a job recovers.

The same state (N keys, one ``ValueState`` each; update checkpoints rewrite a
share of the keys) restored three ways:

(a) from dstl: the materialization plus a changelog tail of 0, 10, 100
    checkpoints, through a real ``dstl-server`` on 127.0.0.1 over a real S3
    server (SeaweedFS), by the product's restore (``restore_subtask``): one
    subtask alone and the whole job at parallelism 2 and 4;
(b) from a full snapshot of the same state written by the same code (a
    materialization with a tail of 0);
(c) Spark's RocksDB state store with changelog checkpointing restoring the
    same job (its state store load time after a restart).

Then (d) the sweep: the job once more for each ``materialize_tail_ratio``
(``--tail-ratios``, the job options' default always among them), restored
after the same rounds and from the longest tail the ratio allows, with the
bytes each uploads per checkpoint: one PNG of both against the ratio.

Also the materialization's throughput through one node. Goals: restore with
the default settings at most 1.2x the full-snapshot restore after tails of
10 and 100 (and the extra upload it costs); the longest tail no slower than
Spark's; materialization >= 200 MB/s. A Markdown report goes to
``loadtest/reports/recovery-<UTC time>.md``.

Modules: ``config`` (settings, goals), ``workload`` (keys, values, rounds,
the job's function), ``dstl_job`` (the job on the DSTL), ``restorer``
(restoring subtasks in processes), ``runner`` ((a) and (b)), ``spark_job``
((c)), ``report`` and ``cli``.
"""
