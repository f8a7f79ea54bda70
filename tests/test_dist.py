"""What ``make dist`` builds: the sdist and the wheel users install.

Built from a copy of the tracked files (``git ls-files``), so neither the
working tree nor its build outputs are touched and nothing untracked slips in;
offline (``--no-isolation``: setuptools and wheel come from the dev extra).
The wheel holds ``dstl_client`` and ``dstl_server`` only: the benchmarks
(``loadtest``) stay in the checkout, and ``pip install dstl`` must not put a
top-level ``loadtest`` package into the user's site-packages. Both files pass
``twine check --strict`` (the metadata PyPI would render).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

pytestmark = pytest.mark.slow  # two builds: ~10-20 s


def tracked_copy(dest: Path) -> Path:
    """The files git tracks (as in the working tree), copied to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a file deleted in the working tree but not yet in git
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel) as ``make dist`` builds them: the wheel is built from the sdist."""
    src = tracked_copy(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    assert sdist.name == f"dstl-{VERSION}.tar.gz"
    assert wheel.name == f"dstl-{VERSION}-py3-none-any.whl"
    return sdist, wheel


def test_the_wheel_holds_the_two_packages_and_no_loadtest(dist: tuple[Path, Path]) -> None:
    _, wheel = dist
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert {n.split("/")[0] for n in names} == {
        "dstl_client",
        "dstl_server",
        f"dstl-{VERSION}.dist-info",
    }
    assert f"dstl-{VERSION}.dist-info/licenses/LICENSE" in names
    assert "dstl_client/py.typed" in names and "dstl_server/py.typed" in names


def test_the_sdist_holds_the_sources_and_no_benchmarks(dist: tuple[Path, Path]) -> None:
    sdist, _ = dist
    with tarfile.open(sdist) as tf:
        names = {n.partition("/")[2] for n in tf.getnames()}
    assert {"pyproject.toml", "README.md", "LICENSE", "dstl_server/cli.py"} <= names
    assert not {n for n in names if n.startswith(("loadtest/", "tests/", ".venv/"))}


def test_twine_accepts_both(dist: tuple[Path, Path]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout
