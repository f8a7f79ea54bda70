"""The README is a front door that cannot rot: short, and every snippet is run.

Every ``python`` block of README.md is an excerpt, verbatim up to indentation,
of a file under ``examples/``; the examples it quotes are run here, so a
snippet that stops working fails this test.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
QUICKSTARTS = ("processor_quickstart.py", "vectorized_quickstart.py")

_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks(text: str) -> list[str]:
    return [textwrap.dedent(m.group(1)).strip("\n") for m in _BLOCK.finditer(text)]


def quoted_in(block: str, source: str) -> bool:
    """Whether ``block`` is a run of consecutive lines of ``source``, up to a common indent."""
    want = block.splitlines()
    lines = source.splitlines()
    for start in range(len(lines) - len(want) + 1):
        window = textwrap.dedent("\n".join(lines[start : start + len(want)]))
        if window == "\n".join(want):
            return True
    return False


def test_quoted_in_needs_consecutive_lines() -> None:
    source = "def f():\n    a = 1\n    b = 2\n    c = 3\n"
    assert quoted_in("a = 1\nb = 2", source)
    assert not quoted_in("a = 1\nc = 3", source)
    assert not quoted_in("a = 2", source)


def test_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for internal in ("this machine", "the final tree", "since then", "../shared", "seed 00"):
        assert internal not in text, internal


def test_every_readme_snippet_is_quoted_from_an_example() -> None:
    blocks = python_blocks(README.read_text())
    assert blocks, "the README has no python snippet"
    sources = {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.py"))}
    for block in blocks:
        homes = [name for name, src in sources.items() if quoted_in(block, src)]
        assert homes, f"README snippet not found verbatim in examples/:\n{block}"


def test_readme_links_resolve() -> None:
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://")):
            continue
        assert (ROOT / target).exists(), f"README links to a missing file: {target}"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("example", QUICKSTARTS)
def test_the_quickstarts_run_and_agree(example: str, tmp_path: Path) -> None:
    """The processor and its vectorized twin: the same job, the same rows."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"TMPDIR": str(tmp_path), **_env()},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("  ")]
    # three batches: counts per user, and bob's timer (last click 3 s + 30 s) fires in
    # the third batch, when the watermark (45 s - 10 s) has passed it
    assert sorted(rows) == sorted(
        [
            ["ada", "clicks", "2"],
            ["ada", "clicks", "3"],
            ["bob", "clicks", "1"],
            ["bob", "idle", "1"],
            ["cy", "clicks", "1"],
            ["cy", "clicks", "2"],
            ["dan", "clicks", "1"],
        ]
    )
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(str(tmp_path) in part for part in (p.info["cmdline"] or ()))
    ]
    assert leftovers == []


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "TMPDIR"}
