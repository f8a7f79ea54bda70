"""What the end-to-end tests share: driver processes to kill, and the kill itself.

A driver is ``python -m <job module> --option value...`` in its own process
group (its JVM included), so a test can SIGKILL it at a chosen phase of a
chosen batch (:func:`crash_at`, the job's ``on_phase``) and start another.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def crash_at(spec: str) -> Callable[[str, int], None]:
    """An ``on_phase`` that SIGKILLs this driver's process group at ``phase:batch`` (``""``: never)."""
    crash_phase, _, crash_batch = spec.partition(":")

    def on_phase(phase: str, batch_id: int) -> None:
        if crash_phase and phase == crash_phase and batch_id == int(crash_batch):
            print(f"crashing at {phase} of batch {batch_id}", flush=True)
            os.killpg(os.getpgid(0), signal.SIGKILL)

    return on_phase


def run_driver(
    module: str,
    options: Mapping[str, object],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 280,
) -> int:
    """Run one driver process to its end; its exit status (``-SIGKILL`` after a crash)."""
    cmd = [sys.executable, "-m", module]
    for name, value in options.items():
        cmd += [f"--{name}", str(value)]
    environ = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=environ, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        # the driver's JVM is in its process group: reap everything, crash or not
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
