"""``make demo``'s Java check (tools/check_java.sh): Java 17+ passes, anything else is one
line saying what to install, exit 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "check_java.sh"


def fake_java_home(tmp: Path, version_line: str) -> Path:
    home = tmp / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return home


def check(java_home: Path | None, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    if java_home is not None:
        env["JAVA_HOME"] = str(java_home)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        ["/bin/sh", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    "line",
    [
        'openjdk version "17.0.15" 2025-04-15',
        'openjdk version "21" 2023-09-19',
        'java version "25.0.1"',
    ],
)
def test_java_17_or_newer_passes(tmp_path: Path, line: str) -> None:
    done = check(fake_java_home(tmp_path, line))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(
    "line", ['java version "1.8.0_292"', 'openjdk version "11.0.2" 2019-01-15']
)
def test_an_older_java_is_refused_with_a_hint(tmp_path: Path, line: str) -> None:
    done = check(fake_java_home(tmp_path, line))
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert "Java 17" in done.stderr and "openjdk-17" in done.stderr


def test_no_java_at_all_is_refused_with_a_hint(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    done = check(None, path=str(empty))
    assert done.returncode == 2
    assert "none was found" in done.stderr and "JAVA_HOME" in done.stderr
