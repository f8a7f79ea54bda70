"""``python -m loadtest.recovery_bench`` at a tiny size: real SeaweedFS, sidecar and Spark;
every table row and a PASS/MISS verdict per goal in the report; nothing left running."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loadtest._procs import processes_mentioning
from tests.s3_fixtures import require_weed

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.s3, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


def test_recovery_bench_runs_tiny_and_reports(tmp_path: Path) -> None:
    require_weed()
    work, reports = tmp_path / "work", tmp_path / "reports"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.recovery_bench",
            "--keys",
            "2000",
            "--tails",
            "0,2",
            "--parallelism",
            "1,2",
            "--load-batch-keys",
            "1000",
            "--update-fraction",
            "0.05",
            "--driver-memory",
            "1g",
            "--dir",
            str(work),
            "--report-dir",
            str(reports),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = list(reports.glob("recovery-*.md"))
    assert len(written) == 1
    text = written[0].read_text()
    for label in (
        "materialization + tail 0",
        "materialization + tail 2",
        "full snapshot (state after 2 updates)",
    ):
        for p in (1, 2):
            assert re.search(rf"^\| {re.escape(label)} \| {p} \|", text, re.M), text
    assert re.search(r"^\| 2 updates \| [\d.]+ \|", text, re.M), text  # Spark's restart
    verdicts = re.findall(r"^- \*\*(PASS|MISS)\*\*: (.*)$", text, re.M)
    assert len(verdicts) == 3, text
    assert "changelog tail of 2 checkpoints" in verdicts[0][1]
    assert "Spark RocksDB" in verdicts[1][1]
    assert "materialization through one node" in verdicts[2][1]
    assert re.search(r"^(PASS|MISS): materialization", proc.stdout, re.M), proc.stdout
    assert not processes_mentioning(str(work)), "a process outlived the benchmark"
