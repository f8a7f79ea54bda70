"""``python -m loadtest.recovery_bench`` at a tiny size: real SeaweedFS and sidecar, the
tail-ratio sweep (one ratio, the floor lifted so that the tiny state reaches it); every
table row and a PASS/MISS verdict per goal in the report; nothing left running.

Spark's job (c) is left out (``--skip-spark``): its three JVM sessions cost most of a
minute, and it measures Spark, not dstl (``make bench-recovery`` runs it)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loadtest._procs import processes_mentioning
from tests.s3_fixtures import require_weed

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(300)]


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
            "2",
            "--load-batch-keys",
            "1000",
            "--update-fraction",
            "0.05",
            "--tail-ratios",
            "0.1",
            "--tail-min-bytes",
            "0",
            "--skip-spark",
            "--dir",
            str(work),
            "--report-dir",
            str(reports),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
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
        assert re.search(rf"^\| {re.escape(label)} \| 2 \|", text, re.M), text
    # the sweep: off (the job above) and 0.1, which 5 % of the keys per round outgrow
    assert re.search(r"^\| off \| [\d.]+x \| [\d.]+x \(2, ", text, re.M), text
    assert re.search(r"^\| 0\.1( \(default\))? \| [\d.]+x \| [\d.]+x \([12], ", text, re.M), text
    if importlib.util.find_spec("matplotlib") is not None:  # the bench extra draws it
        assert (reports / (written[0].stem + "-tail-ratio.png")).stat().st_size > 0
    verdicts = re.findall(r"^- \*\*(PASS|MISS)\*\*: (.*)$", text, re.M)
    assert len(verdicts) == 2, text
    assert "default settings" in verdicts[0][1]
    assert "changelog tail of 2 checkpoints" in verdicts[0][1]
    assert "materialization through one node" in verdicts[1][1]
    assert re.search(r"^(PASS|MISS): restore with the default settings", proc.stdout, re.M)
    assert re.search(r"^(PASS|MISS): materialization", proc.stdout, re.M), proc.stdout
    assert not processes_mentioning(str(work)), "a process outlived the benchmark"
