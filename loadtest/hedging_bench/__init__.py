"""Hedging benchmark (``python -m loadtest.hedging_bench``; ``--quick`` for a smoke run).

One run, one real S3 server (SeaweedFS ``weed mini``) behind the fault proxy
(:mod:`loadtest.s3fault`) with a heavy tail: by default 2% of PUTs are held
1-2 s before they reach the store. For each hedge mode (``off``, ``fixed``,
``adaptive``) a fresh ``dstl-server`` process stores through the proxy and
64 writers checkpoint against it:

* writers run on threads in a few processes (one client per process, as
  PySpark workers would); each loops: append a few changes, ``persist_durably``
  and wait for the handle, now and then truncate (a materialization), think
  for a random 0-2x ``--think-ms``. Writers are not in lockstep, so the
  sidecar makes many uploads (one object per flush) and the tail of upload
  latency shows in the tail of persist latency.
* persist latency (call to handle, measured by the writer) after a warm-up
  goes into an HdrHistogram: p50/p99/p99.9/max per mode.
* the cost: PUT and DeleteObjects requests the proxy saw, against the
  uploads the sidecar made (its metrics). "extra PUTs" = PUTs beyond one per
  upload (hedges and retries); "extra requests" adds the deletes of losing
  attempts.

Goal (the hedging target in the README's benchmarks): p99.9 cut by at least half against ``off`` for at
most 5% extra requests. Prints a table and writes a JSON report to
``loadtest/reports/`` (``--report-dir``). Figures are what this run measured
on this machine; a shared 2-core box is noisy, so compare modes within a run.

Modules: :mod:`~loadtest.hedging_bench.config` (:class:`BenchConfig`),
:mod:`~loadtest.hedging_bench.writers` (writer processes),
:mod:`~loadtest.hedging_bench.modes` (one mode measured),
:mod:`~loadtest.hedging_bench.report` (verdicts, table),
:mod:`~loadtest.hedging_bench.runner` (a whole run) and
:mod:`~loadtest.hedging_bench.cli`.
"""

from __future__ import annotations

from loadtest.hedging_bench.cli import main
from loadtest.hedging_bench.config import DEFAULT_REPORT_DIR, MODES, QUICK, BenchConfig
from loadtest.hedging_bench.modes import ModeResult, run_mode
from loadtest.hedging_bench.report import table, verdicts
from loadtest.hedging_bench.runner import run
from loadtest.hedging_bench.writers import WriterStats

__all__ = [
    "DEFAULT_REPORT_DIR",
    "MODES",
    "QUICK",
    "BenchConfig",
    "ModeResult",
    "WriterStats",
    "main",
    "run",
    "run_mode",
    "table",
    "verdicts",
]
