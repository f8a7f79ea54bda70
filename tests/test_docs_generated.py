"""The sidecar's configuration table (docs/sidecar.md) and docs/observability.md's metrics tables match the code."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
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


def test_every_job_option_has_a_meaning() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_docs
    finally:
        sys.path.remove(str(ROOT / "tools"))
    from dstl_client.batch.options import KeyedOptions

    docs = gen_docs.field_docs(KeyedOptions)
    undocumented = sorted(
        f.name for f in dataclasses.fields(KeyedOptions) if not docs.get(f.name, "").strip()
    )
    assert undocumented == [], "give these fields a #: comment"
