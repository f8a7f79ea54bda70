"""Wire fuzz: hostile and random raw requests get typed answers in time and harm nobody.

Runs :mod:`loadtest.wire_fuzz` against a real ``dstl-server`` process for
``FUZZ_DURATION_S`` seconds: raw requests with random log ids, numbers up to
2^64-1, empty/inconsistent/huge parts, hostile ``ReadChanges`` handles,
``Forward`` sections, garbage bytes, and the amplification shapes (handles
padded with empty entries, millions of blank parts, empty discard keys and
empty forwarded sections). Every call must end OK or with a typed error within 10 s, the
ordered writers must never be told a call was lost, the server must stay
healthy and within its memory bound, and a bystander writer of another job
must read back byte-exact afterwards. The seed is random and printed on
failure; ``DSTL_FUZZ_SEED=N`` replays it (``python -m loadtest.wire_fuzz
--seed N`` runs the same fuzzer longer).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from dstl_server.testing import ServerProcess
from loadtest.wire_fuzz import FuzzSettings, run_fuzz

#: seconds of fuzzing (the whole test takes a few seconds more)
FUZZ_DURATION_S = 20.0
FUZZ_WORKERS = 3

pytestmark = pytest.mark.slow


def test_wire_fuzz(tmp_path: Path) -> None:
    seed = int(os.environ.get("DSTL_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
    settings = FuzzSettings()
    progress: list[str] = []
    with ServerProcess(tmp_path / "srv", extra_args=settings.server_args()) as proc:
        assert proc.proc is not None
        report = run_fuzz(
            proc.address,
            settings=settings,
            duration_s=FUZZ_DURATION_S,
            seed=seed,
            workers=FUZZ_WORKERS,
            server_pid=proc.proc.pid,
            on_runaway=proc.kill,
            log=progress.append,
        )
    stderr_tail = proc.stderr_path.read_text(errors="replace")[-3000:]
    explain = (
        f"{report.render()}\n\nprogress:\n" + "\n".join(progress) + "\n\nserver stderr (tail):\n"
        f"{stderr_tail}\n\nreplay: DSTL_FUZZ_SEED={seed} pytest {__file__}"
    )
    assert report.passed, explain
    # The fuzzer reached every method and got past validation often enough to matter.
    assert set(report.by_method) >= {
        "CreateWriter",
        "Append",
        "LastAppendedSqn",
        "PersistDurably",
        "Truncate",
        "CloseWriter",
        "ReadChanges",
        "DiscardObjects",
        "Forward",
    }, explain
    assert report.calls >= 200 and report.by_kind["OK"] >= 50, explain
