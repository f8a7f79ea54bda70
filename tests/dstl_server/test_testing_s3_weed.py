"""The launcher of the test S3 server: weed dies with its parent through an exec
wrapper, not a ``preexec_fn`` (which forks the caller; with gRPC loaded, gRPC's fork
handlers aborted such a child once in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dstl_server.testing_s3_weed import die_with_parent

_PARENT = """
import subprocess, sys
from dstl_server.testing_s3_weed import die_with_parent
child = subprocess.Popen(die_with_parent(["/bin/sleep", "60"]))
print(child.pid, flush=True)
sys.stdin.read()  # until the test kills us
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead for our purpose
        return f.read().split(")")[-1].split()[0] != "Z"


def _command(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_the_wrapped_command_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    child_pid = 0
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        # exec replaces the wrapper: the pid Popen knows becomes the real command's
        deadline = time.monotonic() + 10
        while _command(child_pid) != b"/bin/sleep" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _command(child_pid) == b"/bin/sleep"
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid)
    finally:
        parent.kill()
        parent.communicate(timeout=10)  # reaps it and closes its pipes
        if child_pid and _alive(child_pid):
            os.kill(child_pid, 9)


def test_the_wrapper_runs_the_command_with_its_arguments_and_exit_code() -> None:
    done = subprocess.run(
        die_with_parent(["/bin/sh", "-c", "echo $0 $1; exit 3", "a", "b c"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 3
    assert done.stdout == "a b c\n"
