"""The checked-in gRPC code in dstl_client/core/_pb matches proto/ (``make proto``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path("proto") / "dstl" / "v1" / "dstl.proto"


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_generated_code_is_current() -> None:
    res = _check(ROOT)
    assert res.returncode == 0, f"{res.stderr}\nrun `make proto` and commit the result"


def test_check_detects_stale_code(tmp_path: Path) -> None:
    """The check is not vacuous: a proto change without regeneration fails it."""
    for rel in ("tools/gen_proto.py", "dstl_client/core/_pb", "proto"):
        src, dst = ROOT / rel, tmp_path / rel
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True)
            shutil.copy2(src, dst)
    proto = tmp_path / PROTO
    proto.write_text(
        proto.read_text().replace(
            "message TruncateResponse {}", "message TruncateResponse { uint64 freed = 1; }"
        )
    )
    res = _check(tmp_path)
    assert res.returncode == 1
    assert "stale" in res.stderr
