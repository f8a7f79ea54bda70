"""Atomic file writes: a temp file, fsync, then rename (replace) or link (write-once).

One routine for every durable file of the project: the sidecar's ``file://``
objects and the driver's checkpoint records and configuration overrides. A
crash leaves either the old state or the complete new file, never a torn one,
plus at most a temp file, which is named so that it is recognisable
(``TEMP_SUFFIX``) and never mistaken for the real thing.

Pure functions, safe from any thread; the blocking calls are the caller's to
move off an event loop.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

#: every temp file ends with this; sweeps remove them, listings skip them
TEMP_SUFFIX = ".tmp-dstl"


def temp_path_for(path: Path) -> Path:
    """A fresh, hidden temp name in ``path``'s directory (same file system)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}")


def is_temp_name(name: str) -> bool:
    return name.endswith(TEMP_SUFFIX)


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a rename, link or unlink) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(path: Path, data: bytes | memoryview, fsync: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def write_replace(path: Path, data: bytes | memoryview, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path``, replacing any file there, atomically."""
    tmp = _write_temp(path, data, fsync)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(path.parent)


def write_once(path: Path, data: bytes | memoryview, *, fsync: bool = True) -> bool:
    """Create ``path`` with ``data`` atomically unless it exists; False if it did.

    The temp file is hard-linked to the final name: ``link`` fails when the
    name exists, so a file written this way is never overwritten, and a
    reader sees either no file or the complete one.
    """
    tmp = _write_temp(path, data, fsync)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    if fsync:
        fsync_dir(path.parent)
    return True
