"""Integration tests run real ``dstl-server`` processes; none may outlive its test."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.s3_fixtures import SESSION_PIDS


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail a test that leaves a child process (a sidecar) running; the session's
    SeaweedFS servers, started by the first test that needs one, stay (killing one would
    fail every later S3 test of the run)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    # children of a stopped sidecar exit on their own: poll (another process), bounded
    deadline = time.monotonic() + 5
    while True:
        left = [
            p
            for p in me.children(recursive=True)
            if p.pid not in before and p.pid not in SESSION_PIDS and _alive(p)
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in left:  # do not let one leak break every later test
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    assert not left, f"test left processes running: {left}"


def _alive(p: psutil.Process) -> bool:
    try:
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
