"""``file://`` blob store: objects are files under a root directory."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from dstl_client.errors import BlobNotFound, StorageError
from dstl_server.storage.base import BlobInfo, BlobStore, validate_key

_TMP_SUFFIX = ".tmp-dstl"


class LocalBlobStore(BlobStore):
    """Objects as files under ``root`` (the embedded default).

    Invariants: a ``put`` writes a temp file in the target directory, fsyncs
    it, renames it over the key and fsyncs the directory, so a crash leaves
    either the old state or the complete new object. Temp files are never
    listed. All file I/O runs in the default thread pool; any task may call.
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
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            if self._fsync:
                dfd = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            with contextlib.suppress(OSError, UnboundLocalError):
                tmp.unlink(missing_ok=True)
            raise StorageError(f"write {path}: {exc}", retryable=True) from exc

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await asyncio.to_thread(self._get, self._path(key), offset, length)

    @staticmethod
    def _get(path: Path, offset: int, length: int | None) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read() if length is None else f.read(length)
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

    async def list(self, prefix: str = "") -> AsyncIterator[BlobInfo]:
        for info in await asyncio.to_thread(self._list, prefix):
            yield info

    def _list(self, prefix: str) -> builtins.list[BlobInfo]:
        out: builtins.list[BlobInfo] = []
        # Walk only the directory the prefix is in, not the whole root.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / base if base else self.root
        if not start.is_dir():
            return out
        for dirpath, _dirs, files in os.walk(start):
            for name in files:
                if name.endswith(_TMP_SUFFIX):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        out.append(BlobInfo(key, full.stat().st_size))
                    except FileNotFoundError:
                        continue
        out.sort(key=lambda b: b.key)
        return out
