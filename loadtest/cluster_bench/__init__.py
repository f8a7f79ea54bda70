"""The multi-node benchmark: a keyed Spark job on standalone clusters with random node kills.

``python -m loadtest.cluster_bench`` (``make bench-cluster``) starts one
SeaweedFS, then for each node count a fresh Spark standalone cluster on
loopback (:mod:`loadtest.spark_cluster`: one ``dstl-server`` per worker) and
the job of :mod:`loadtest.cluster_bench.job` (a running count and sum per
key). Every ``--kill-every-batches`` batches a random node is SIGKILLed
(worker, executor, Python workers, sidecar) at a random point of a batch
and started again a few seconds later. It prints and reports the batch and
checkpoint durations, the recovery after each kill, the objects each node's
sidecar uploaded, and whether the outputs equal the failure-free
expectation (:mod:`loadtest.cluster_bench.workload`).
"""
