"""Forwarding-tree benchmark: K sidecars in front of one SeaweedFS, direct vs. trees.

``python -m loadtest.tree_bench`` (``make bench-tree``) starts K ``dstl-server``
processes on loopback storing in one SeaweedFS bucket, W writer threads per
node checkpointing once per interval, and measures, per configuration (direct;
static trees of fan-out 4 and 2; fan-out 4 behind the S3 fault proxy), objects
and PUTs per checkpoint, persist latency, throughput, CPU and RSS per process,
then checks the goals and writes ``loadtest/reports/tree-<UTC time>.md``.

Modules: :mod:`~loadtest.tree_bench.config` (settings, tree shapes),
:mod:`~loadtest.tree_bench.cluster` (the processes),
:mod:`~loadtest.tree_bench.writers` (writer threads),
:mod:`~loadtest.tree_bench.runner` (one configuration, the goals),
:mod:`~loadtest.tree_bench.report` (Markdown, plot) and
:mod:`~loadtest.tree_bench.cli`.
"""

from __future__ import annotations

from loadtest.tree_bench.cli import main
from loadtest.tree_bench.config import BenchConfig, TreeShape

__all__ = ["BenchConfig", "TreeShape", "main"]
