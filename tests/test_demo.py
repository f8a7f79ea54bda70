"""``examples/demo.py`` (``make demo-core``): runs to the end and verifies every byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "demo.py"

pytestmark = pytest.mark.slow


def _servers_under(path: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(path) in part for part in p.info["cmdline"] or ()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_demo_verifies_every_byte(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "OK: all bytes verified" in out
    for line in ("changes appended", "objects written", "persist latency", "recovery"):
        assert line in out
    for cp in range(1, 9):
        assert f"checkpoint {cp}: 4 writers persisted" in out
    assert "(materialized: logs truncated)" in out
    assert _servers_under(tmp_path) == []


def test_demo_fails_loudly_and_stops_the_sidecar(tmp_path: Path) -> None:
    # A sidecar that accepts no change bigger than 8 bytes: the first append fails.
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--dir", str(tmp_path), "--checkpoints", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DSTL_MAX_CHANGE_BYTES": "8"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stderr and "ChangeTooLarge" in proc.stderr
    assert "OK: all bytes verified" not in proc.stdout
    assert _servers_under(tmp_path) == []


CHAINED = REPO / "examples" / "processor_chained.py"


@pytest.mark.spark
def test_chained_processor_example_runs_as_pasted(tmp_path: Path) -> None:
    """An event-time processor emitting timestamps, chained into a windowed aggregation."""
    env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
    proc = subprocess.run(
        [sys.executable, str(CHAINED)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**env, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("  ")]
    # windows closed, in order, each 10 s long, every session counted once: the windows
    # hold sessions with at least one click each
    assert len(rows) >= 2
    starts = [r[0] for r in rows]
    assert starts == sorted(starts)
    assert all(int(r[2]) >= 1 and int(r[3]) >= int(r[2]) for r in rows)
    assert _servers_under(tmp_path) == []
