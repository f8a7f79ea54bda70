"""Where node-local stores live, and the lock that makes one task own a store.

``<state_dir>/<job>/<operator>/kg-<first>-<last>``: one directory per
key-group range. A store is owned by one task at a time through an
exclusive ``flock`` on its ``lock`` file; a rescale leaves stores of other
ranges behind, which :func:`remove_overlapping_stores` deletes once their
key groups were restored elsewhere.

Functions only; any thread (the locks are per process and file).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import sqlite3
import time
from pathlib import Path

from dstl_client.core.errors import DstlError
from dstl_client.keygroups import KeyGroupRange


class StoreLocked(DstlError):
    """Another task holds this key-group range's store for too long."""

    kind = "store_locked"


def store_dir(
    state_dir: str | Path, job_id: str, operator_id: str, kg_range: KeyGroupRange
) -> Path:
    """Where the store of one key-group range of one operator lives."""
    return Path(state_dir) / job_id / operator_id / f"kg-{kg_range.first}-{kg_range.last}"


def lock_file(path: Path, timeout_s: float) -> int:
    """An exclusive ``flock`` on ``path`` within ``timeout_s``; the open descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
        if time.monotonic() >= deadline:
            os.close(fd)
            raise StoreLocked(f"the state store {path.parent} stayed locked for {timeout_s}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def remove_overlapping_stores(
    operator_dir: Path, kg_range: KeyGroupRange, keep: Path
) -> list[tuple[Path, str]]:
    """Delete stores of other ranges that overlap ``kg_range`` (stale after a rescale).

    A store another task holds (locked) is left alone. Returns the removed
    directories with the log id of their changelog writer ("" if none), so the
    caller can close those writers at the sidecar.
    """
    removed: list[tuple[Path, str]] = []
    if not operator_dir.is_dir():
        return removed
    for child in operator_dir.iterdir():
        if child == keep or not child.name.startswith("kg-"):
            continue
        try:
            _, first, last = child.name.split("-")
            other = KeyGroupRange(int(first), int(last))
        except (ValueError, DstlError):
            continue
        if other.intersection(kg_range) is None:
            continue
        try:
            fd = lock_file(child / "lock", 0.0)
        except (StoreLocked, OSError):
            continue
        try:
            log_id = ""
            with contextlib.suppress(sqlite3.Error):
                db = sqlite3.connect(f"file:{child / 'state.sqlite'}?mode=ro", uri=True)
                try:
                    row = db.execute("SELECT value FROM meta WHERE name = 'log_id'").fetchone()
                    log_id = str(row[0]) if row else ""
                finally:
                    db.close()
            shutil.rmtree(child, ignore_errors=True)
            removed.append((child, log_id))
        finally:
            os.close(fd)
    return removed
