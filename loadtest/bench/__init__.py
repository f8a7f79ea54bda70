"""The dstl core benchmark (``make bench-core`` / ``python -m loadtest.bench``).

Starts a real ``dstl-server`` process on ``file://`` storage in a temporary
directory and drives it from several writer *processes* (each with its own
client, several writers per process on threads):

1. **append** -- writers append batches as fast as they can for
   ``--duration`` seconds, checkpointing every ``--checkpoint-interval`` and
   truncating every few checkpoints, with pre-emptive uploads on; once with
   small changes (the changes/s figure) and once with large ones (MB/s).
   Server RSS is sampled throughout. Baseline: the bytes the service stored,
   written straight to the same store in objects of the same size.
2. **checkpoint** -- for each writer count (1, 8, 64), rounds in lockstep:
   every writer appends ``--round-bytes``, then all persist together. Client
   persist latency goes into an HdrHistogram; objects per flush come from the
   server's metrics. Baseline: the store's own put latency for objects of the
   size the service wrote. "Added" latency at quantile q is
   ``persist(q) - persist delay - put(q)``.

Prints a table with PASS/MISS against the targets (README, Benchmarks) and writes a JSON
report to ``loadtest/reports/`` (``--report-dir``). Every figure is what this
run measured on this machine; nothing is extrapolated.

Modules: :mod:`~loadtest.bench.config` (:class:`BenchConfig`, the targets),
:mod:`~loadtest.bench.processes` (writer processes),
:mod:`~loadtest.bench.target` (the server under test),
:mod:`~loadtest.bench.measure` (latency figures), the phases
:mod:`~loadtest.bench.rpc`, :mod:`~loadtest.bench.append` and
:mod:`~loadtest.bench.checkpoint`, :mod:`~loadtest.bench.runner`
(:class:`Bench`), :mod:`~loadtest.bench.goals` (verdicts),
:mod:`~loadtest.bench.report` (table, JSON) and :mod:`~loadtest.bench.cli`.
"""

from __future__ import annotations

from loadtest.bench.cli import build_parser, config_from_args, main
from loadtest.bench.config import (
    DEFAULT_REPORT_DIR,
    QUICK,
    BenchConfig,
    BenchError,
)
from loadtest.bench.goals import targets
from loadtest.bench.report import format_report, write_report
from loadtest.bench.runner import Bench

__all__ = [
    "DEFAULT_REPORT_DIR",
    "QUICK",
    "Bench",
    "BenchConfig",
    "BenchError",
    "build_parser",
    "config_from_args",
    "format_report",
    "main",
    "targets",
    "write_report",
]
