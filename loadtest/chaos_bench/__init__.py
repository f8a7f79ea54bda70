"""The chaos benchmark: a keyed job with timers under a seeded random fault schedule.

``python -m loadtest.chaos_bench`` (``make bench-chaos``) starts one
SeaweedFS and the S3 fault proxy (:mod:`loadtest.s3fault`) in front of it,
then runs rounds until ``--minutes`` are up. Each round is a fresh 2-node
Spark standalone cluster (:mod:`loadtest.spark_cluster`, one sidecar per
node) running the processor job of :mod:`loadtest.chaos_bench.job` (value
and map state, event-time timers) while :mod:`loadtest.chaos_bench.runner`
injects the round's schedule (:mod:`loadtest.chaos_bench.schedule`, drawn
from the seed and the round number): sidecar SIGKILLs, executor and node
kills, driver kills with a restart on a fresh disk, a rescale, and windows
of S3 503s, connection resets and 2 s stalls. The round's output must equal
the failure-free run of the batches Spark committed
(:mod:`loadtest.chaos_bench.workload`). It prints the seed and each
schedule first, each round's verdict and, at the end, the count of each
fault injected and PASS/MISS; ``--seed N`` replays a run's schedules.

Modules: ``config`` (:class:`~loadtest.chaos_bench.config.ChaosConfig`),
``schedule``, ``workload``, ``job``, ``faults``, ``runner``, ``report`` and
``cli``.
"""
