"""``python -m loadtest.mat_bench`` at a tiny size: real SeaweedFS and sidecar; a line
per round and a PASS/MISS verdict against this machine's goal; nothing left running."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.mat_bench import GOAL_MB_S_2_CORES, GOAL_MB_S_MANY_CORES, goal_mb_s
from tests.loadtest._procs import processes_mentioning
from tests.s3_fixtures import require_weed

REPO = Path(__file__).resolve().parents[2]


def test_the_goal_is_150_on_a_small_machine_and_200_on_a_large_one() -> None:
    assert goal_mb_s(2) == GOAL_MB_S_2_CORES == 150.0
    assert goal_mb_s(16) == GOAL_MB_S_MANY_CORES == 200.0


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mat_bench_runs_tiny_and_judges(tmp_path: Path) -> None:
    require_weed()
    work = tmp_path / "work"
    args = ["-m", "loadtest.mat_bench", "--keys", "3000", "--rounds", "2", "--dir", str(work)]
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rounds = re.findall(
        r"^round \d: ([\d.]+) MB, .* ([\d.]+) MB/s; CPU ms per MB", proc.stdout, re.M
    )
    assert len(rounds) == 2, proc.stdout
    assert all(float(mb) > 0.3 for mb, _ in rounds), proc.stdout  # 2 x 3,000 rows of ~120 B
    goal = f"goal >= {goal_mb_s():g} MB/s"
    assert re.search(
        rf"^  (PASS|MISS)  materialization through one node: .*{goal}", proc.stdout, re.M
    )
    assert not processes_mentioning(str(work)), "a process outlived the benchmark"
