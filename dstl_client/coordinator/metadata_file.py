"""The job metadata store on a local or shared POSIX directory."""

from __future__ import annotations

import builtins
import contextlib
import os
from pathlib import Path

from dstl_client.coordinator.metadata_store import (
    MetadataStore,
    MetadataStoreError,
    check_name,
    check_prefix,
)
from dstl_client.core.atomic import fsync_dir, is_temp_name, write_once, write_replace

__all__ = ["FileMetadataStore"]


class FileMetadataStore(MetadataStore):
    """Files under a directory of a local or shared POSIX file system.

    ``put_once``: :func:`~dstl_client.core.atomic.write_once` (temp file,
    fsync, hard link: ``link`` fails when the name exists); ``put``:
    :func:`~dstl_client.core.atomic.write_replace` (temp file, fsync,
    rename). Directories are fsynced after a link, rename or unlink unless
    ``fsync=False`` (tests). Stateless apart from its root: any thread.
    """

    def __init__(self, root: str | Path, *, fsync: bool = True) -> None:
        self.root = Path(root).absolute()
        self._fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MetadataStoreError(f"cannot create the job metadata directory: {exc}") from None

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def path_of(self, name: str) -> Path:
        return self.root / check_name(name)

    def describe(self, name: str) -> str:
        return str(self.path_of(name))

    def put_once(self, name: str, data: bytes) -> bool:
        path = self.path_of(name)
        try:
            return write_once(path, data, fsync=self._fsync)
        except OSError as exc:
            raise MetadataStoreError(f"cannot write {path}: {exc}") from None

    def put(self, name: str, data: bytes) -> None:
        path = self.path_of(name)
        try:
            write_replace(path, data, fsync=self._fsync)
        except OSError as exc:
            raise MetadataStoreError(f"cannot write {path}: {exc}") from None

    def get(self, name: str) -> bytes | None:
        path = self.path_of(name)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise MetadataStoreError(f"cannot read {path}: {exc}") from None

    def _walk(self, prefix: str) -> builtins.list[tuple[Path, str, str]]:
        """``(directory, file name, name)`` of every file in the folder of ``prefix``, recursively.

        The folder is the prefix up to its last ``/``; hidden folders are
        skipped (names have none), hidden files are returned (temp files).
        """
        check_prefix(prefix)
        folder = prefix.rpartition("/")[0]
        base = self.root / folder if folder else self.root
        if not base.is_dir():
            return []
        out: builtins.list[tuple[Path, str, str]] = []
        try:
            for dirpath, dirnames, filenames in os.walk(base, onerror=_raise_unless_gone):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                here = Path(dirpath)
                rel = here.relative_to(self.root).as_posix()
                out.extend((here, f, f if rel == "." else f"{rel}/{f}") for f in filenames)
        except OSError as exc:
            raise MetadataStoreError(f"cannot list {base}: {exc}") from None
        return out

    def list(self, prefix: str = "") -> builtins.list[str]:
        return sorted(
            name
            for _, f, name in self._walk(prefix)
            if not f.startswith(".") and name.startswith(prefix)
        )

    def delete(self, name: str) -> None:
        path = self.path_of(name)
        try:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(path)
            if self._fsync and path.parent.is_dir():
                fsync_dir(path.parent)
        except OSError as exc:
            raise MetadataStoreError(f"cannot delete {path}: {exc}") from None

    def remove_temp_files(self, prefix: str = "") -> int:
        """Temp files (and ``.tmp-*`` of older versions) in the folder of ``prefix``, recursively."""
        n = 0
        for here, f, _ in self._walk(prefix):
            if is_temp_name(f) or f.startswith(".tmp-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(here / f)
                    n += 1
        return n


def _raise_unless_gone(exc: OSError) -> None:
    """``os.walk``'s error handler: a folder removed meanwhile has no names; else fail."""
    if not isinstance(exc, FileNotFoundError):
        raise exc
