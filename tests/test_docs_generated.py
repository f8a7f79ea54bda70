"""The sidecar's configuration table (docs/sidecar.md) and docs/observability.md's metrics tables match the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_tables_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_readme_opens_with_the_two_commands() -> None:
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:15])
    assert "make demo" in head and "make test" in head
