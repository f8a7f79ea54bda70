"""The chaos bench's short variant (``--short``): a fixed seed, one small round, a few faults.

A real 2-node Spark standalone cluster, one sidecar per node and one on the
driver's node, SeaweedFS behind the S3 fault proxy, the processor job with
timers; seed 7 kills the driver node's sidecar and the driver (a new one on
a fresh disk) and opens a window of S3 connection resets and one of 503s.
The run must inject every fault of its schedule, end with PASS (the output
equals the failure-free run's), print the seed, the schedule and the count
of each fault, and leave nothing running.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._spark_job import TEST_JVM_OPTIONS
from tests.loadtest._procs import processes_mentioning
from tests.s3_fixtures import require_weed

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.s3, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_short_chaos_run_injects_its_faults_and_gets_the_failure_free_output(
    tmp_path: Path,
) -> None:
    require_weed()
    work, reports = tmp_path / "work", tmp_path / "reports"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.chaos_bench",
            "--short",
            "--dir",
            str(work),
            "--report-dir",
            str(reports),
            # every JVM of the cluster and its drivers: the tests' light options
            f"--jvm-options={TEST_JVM_OPTIONS}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:] + proc.stderr[-3000:]
    assert "seed 7;" in out
    # the schedule first, then each fault as it went: all four injected
    assert "schedule round 0 (seed 7): 4 faults" in out
    for kind in ("sidecar-kill", "driver-kill", "s3-503", "s3-reset"):
        m = re.search(rf"^{kind}\s+(\d+)\s+(\d+)$", out, re.M)
        assert m is not None, out[-3000:]
        assert int(m.group(1)) == int(m.group(2)) == 1, m.group(0)
    assert "not injected" not in out
    assert re.search(r"^PASS: final output equals the failure-free run in 1/1 rounds$", out, re.M)
    # the sidecars and the driver's records went through the fault proxy
    assert re.search(r"S3 requests through the proxy: [1-9]\d*; faulted: ", out), out[-2000:]
    assert len(list(reports.glob("chaos-*.json"))) == 1
    # nothing of the run is left: no driver, worker, executor or sidecar (each names a
    # path under the work directory on its command line)
    assert not processes_mentioning(str(work))
