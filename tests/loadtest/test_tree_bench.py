"""``python -m loadtest.tree_bench`` with K=3, W=2, 2 s per configuration: it runs end to end,
the tree merges the nodes' flushes, every sampled handle reads back and nothing is left running."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loadtest._procs import processes_mentioning
from tests.s3_fixtures import require_weed

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.s3


def _row(table: str, name: str) -> list[str]:
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and cells[0] == name:
            return cells
    raise AssertionError(f"no row {name!r} in\n{table}")


def test_tree_bench_runs_small_and_reports(tmp_path: Path) -> None:
    require_weed()
    work, reports = tmp_path / "work", tmp_path / "reports"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.tree_bench",
            "--nodes",
            "3",
            "--writers",
            "2",
            "--duration-s",
            "2",
            "--warmup-rounds",
            "1",
            "--verify-fraction",
            "1",
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
    out = proc.stdout
    for name in ("direct", "tree4", "tree2", "tree4-faults"):
        assert f"[tree-bench] {name}: done" in out, out
    # K=3: direct uploads at least one object per node and checkpoint; the tree
    # merges them (a straggling writer may split a round, on a busy machine)
    direct, tree4 = _row(out, "direct"), _row(out, "tree4")
    direct_objects, tree_objects = float(direct[6].split()[0]), float(tree4[6].split()[0])
    assert direct_objects >= 3.0
    assert 1.0 <= tree_objects <= direct_objects / 2
    assert int(tree4[15]) == 0  # no forward fell back
    assert re.search(r"^PASS: acknowledged handles read back byte-exact: (\d+)/\1 ", out, re.M), out
    assert "objects per checkpoint, fan-out 4" in out and "persist p99, fan-out 4" in out
    reports_written = list(reports.glob("tree-*.md"))
    assert len(reports_written) == 1
    text = reports_written[0].read_text()
    assert "| tree2 |" in text and "## Goals" in text and "sidecar-2" in text
    assert not processes_mentioning(str(work)), "a sidecar outlived the benchmark"
