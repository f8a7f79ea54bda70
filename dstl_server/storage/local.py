"""``file://`` blob store: objects are files under a root directory."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from dstl_client.core.atomic import TEMP_SUFFIX, write_replace
from dstl_client.core.errors import BlobNotFound, InvalidArgument, StorageError
from dstl_server.storage.base import BlobInfo, BlobStore, validate_key

#: every file the store writes is first named ``.<name>.<random><_TMP_SUFFIX>``
_TMP_SUFFIX = TEMP_SUFFIX
#: files :meth:`LocalBlobStore.list` stats per thread hop
_STAT_CHUNK = 256
#: name start of the files :meth:`LocalBlobStore.probe` writes (temp files too)
_PROBE_PREFIX = ".dstl-probe."

log = logging.getLogger(__name__)


class LocalBlobStore(BlobStore):
    """Objects as files under ``root`` (the embedded default).

    Invariants: a ``put`` writes a temp file in the target directory, fsyncs
    it, renames it over the key and fsyncs the directory, so a crash leaves
    either the old state or the complete new object (plus, after a crash, the
    temp file). Temp files (names ending in ``.tmp-dstl``) are never listed or
    read as objects; :meth:`sweep_leftovers` removes those of interrupted
    writes. :meth:`probe` writes and removes a small temp-named file in the
    root, so it proves writes work (``os.access`` is always true for root) and
    a probe cut short leaves only a leftover for the sweep. The store owns its
    root: no other process writes temp files there. All file I/O runs in the
    default thread pool; any task may call.
    """

    def __init__(self, root: str | Path, *, fsync: bool = True) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = f"file://{self.root}"
        self._fsync = fsync

    def _path(self, key: str) -> Path:
        validate_key(key)
        return self.root / key

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, self._path(key), data)

    def _put(self, path: Path, data: bytes) -> None:
        try:
            write_replace(path, data, fsync=self._fsync)
        except OSError as exc:
            raise StorageError(f"write {path}: {exc}", retryable=True) from exc

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        if offset < 0 or (length is not None and length < 0):
            raise InvalidArgument(f"bad range offset={offset} length={length}")
        return await asyncio.to_thread(self._get, self._path(key), offset, length)

    @staticmethod
    def _get(path: Path, offset: int, length: int | None) -> bytes:
        try:
            with open(path, "rb") as f:
                # Never allocate by the caller's number: at most what the file holds.
                size = os.fstat(f.fileno()).st_size
                if offset >= size:
                    return b""
                f.seek(offset)
                return f.read(size - offset if length is None else min(length, size - offset))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            # a directory is a key prefix, not an object (as on S3)
            raise BlobNotFound(f"no object {path.name} at {path.parent}") from exc
        except OSError as exc:
            raise StorageError(f"read {path}: {exc}", retryable=True) from exc

    async def delete(self, keys: Sequence[str]) -> int:
        paths = [self._path(k) for k in keys]
        return await asyncio.to_thread(self._delete, paths)

    @staticmethod
    def _delete(paths: builtins.list[Path]) -> int:
        n = 0
        for p in paths:
            try:
                p.unlink()
                n += 1
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                pass
            except OSError as exc:
                raise StorageError(f"delete {p}: {exc}", retryable=True) from exc
        return n

    async def probe(self) -> None:
        """Create the root if needed, write and remove a small file in it."""
        await asyncio.to_thread(self._probe)

    def _probe(self) -> None:
        tmp = self.root / f"{_PROBE_PREFIX}{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, b"dstl probe\n")
            finally:
                os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StorageError(
                f"store {self.url} does not answer: cannot write in {self.root}: {exc}",
                retryable=True,
            ) from exc

    def fatal_at_start(self, error: StorageError) -> bool:
        """A directory that cannot be written at start is a configuration error."""
        return True

    async def sweep_leftovers(self, older_than_s: float) -> int:
        """Remove temp files under the root last modified more than ``older_than_s`` ago.

        ``older_than_s <= 0`` removes every temp file (at open: all belong to
        an earlier process). Symlinks are not followed; files that cannot be
        removed are logged (one line) and skipped.
        """
        return await asyncio.to_thread(self._sweep, older_than_s)

    def _sweep(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        removed = 0
        failed: builtins.list[str] = []
        # os.walk ignores unreadable directories and a missing root
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if not name.endswith(_TMP_SUFFIX):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                    if stat.S_ISDIR(st.st_mode):
                        continue
                    if older_than_s > 0 and st.st_mtime > cutoff:
                        continue  # maybe a write in progress
                    os.unlink(path)
                    removed += 1
                except FileNotFoundError:
                    continue  # finished (renamed) or removed meanwhile
                except OSError as exc:
                    failed.append(f"{path}: {exc.strerror or exc}")
        if failed:
            log.warning(
                "could not remove %d leftover temp file(s) under %s: %s",
                len(failed),
                self.root,
                "; ".join(failed[:3]),
            )
        return removed

    async def list(self, prefix: str = "", start_after: str = "") -> AsyncIterator[BlobInfo]:
        # Names first (no stat), sorted; then sizes and times a chunk at a
        # time, so a caller that stops early (a page) stats only what it took.
        names = await asyncio.to_thread(self._names, prefix, start_after)
        for i in range(0, len(names), _STAT_CHUNK):
            for info in await asyncio.to_thread(_stat_all, names[i : i + _STAT_CHUNK]):
                yield info

    def _names(self, prefix: str, start_after: str) -> builtins.list[tuple[str, str]]:
        """``(key, path)`` of the files listed, in key order."""
        out: builtins.list[tuple[str, str]] = []
        # Walk only the directory the prefix is in, not the whole root.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / base if base else self.root
        if not start.is_dir():
            return out
        for dirpath, dirs, files in os.walk(start):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            here = "" if rel == "." else rel + "/"
            if start_after:
                # Skip directories whose every key sorts before start_after.
                dirs[:] = [d for d in dirs if not _all_keys_before(here + d + "/", start_after)]
            for name in files:
                if name.endswith(_TMP_SUFFIX):
                    continue
                key = here + name
                if key.startswith(prefix) and key > start_after:
                    out.append((key, os.path.join(dirpath, name)))
        out.sort()
        return out


def _stat_all(names: list[tuple[str, str]]) -> list[BlobInfo]:
    out = []
    for key, path in names:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue  # deleted since it was listed
        except OSError as exc:
            raise StorageError(f"list {path}: {exc}", retryable=True) from exc
        out.append(BlobInfo(key, st.st_size, st.st_mtime))
    return out


def _all_keys_before(dir_prefix: str, start_after: str) -> bool:
    """Whether every key starting with ``dir_prefix`` sorts at or before ``start_after``."""
    return dir_prefix < start_after and not start_after.startswith(dir_prefix)
