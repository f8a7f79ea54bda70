"""The ``file://`` store: the blob store contract plus what only files can show."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dstl_client.errors import BlobNotFound, ConfigError, StorageError
from dstl_server.settings import ServerSettings
from dstl_server.storage import LocalBlobStore, open_store
from dstl_server.storage.base import BlobStore
from tests.dstl_server.storage.contract import BlobStoreContract

TMP_SUFFIX = ".tmp-dstl"


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


class TestLocalBlobStore(BlobStoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[BlobStore]:
        async with LocalBlobStore(tmp_path / "objects", fsync=False) as s:
            yield s


class TestLocalBlobStoreFsync(BlobStoreContract):
    """The same contract with fsync on (the production setting)."""

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[BlobStore]:
        async with LocalBlobStore(tmp_path / "objects", fsync=True) as s:
            yield s


async def test_objects_are_plain_files_under_root(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "root")
    await store.put("job/ab/obj.dstl", b"payload")
    assert (tmp_path / "root" / "job" / "ab" / "obj.dstl").read_bytes() == b"payload"
    assert store.url == f"file://{(tmp_path / 'root').resolve()}"


async def test_no_temp_files_left_after_puts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalBlobStore(root)
    for i in range(10):
        await store.put(f"j/{i % 3}/k{i}", os.urandom(1000 + i))
    await store.put("j/0/k0", b"overwritten")
    assert not [f for f in _files(root) if f.endswith(TMP_SUFFIX)]
    assert len(_files(root)) == 10


async def test_leftover_temp_file_is_not_listed(tmp_path: Path) -> None:
    """A crash between create and rename leaves a temp file: it is never an object."""
    root = tmp_path / "root"
    store = LocalBlobStore(root)
    await store.put("job/00/done.dstl", b"complete")
    # What _put leaves behind when the process dies mid-write.
    partial = root / "job" / "00" / f".crashed.dstl.0123abcd{TMP_SUFFIX}"
    partial.write_bytes(b"half an obj")
    listed = [i.key async for i in store.list("job/")]
    assert listed == ["job/00/done.dstl"]
    assert [i.key async for i in store.list("")] == ["job/00/done.dstl"]
    with pytest.raises(BlobNotFound):
        await store.get("job/00/crashed.dstl")


@pytest.mark.parametrize("fsync", [True, False])
async def test_fsync_of_file_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    monkeypatch.setattr("dstl_server.storage.local.os.fsync", spy)
    store = LocalBlobStore(tmp_path / "root", fsync=fsync)
    await store.put("a/b/c", b"durable")
    assert await store.get("a/b/c") == b"durable"
    assert synced == (["file", "dir"] if fsync else [])


async def test_failed_write_leaves_no_temp_and_is_typed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalBlobStore(root)
    (root / "dir-in-the-way").mkdir()
    (root / "dir-in-the-way" / "x").write_bytes(b"keep")
    # renaming over a non-empty directory fails after the temp file was written
    with pytest.raises(StorageError):
        await store.put("dir-in-the-way", b"new")
    # a file where a directory should be: mkdir fails before any temp file exists
    await store.put("file", b"f")
    with pytest.raises(StorageError):
        await store.put("file/child", b"c")
    assert _files(root) == ["dir-in-the-way/x", "file"]


def test_open_store_file_urls(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/objs")
    assert isinstance(store, LocalBlobStore)
    assert store.root == (tmp_path / "objs").resolve()
    store = open_store(f"file://localhost{tmp_path}/o2", ServerSettings(fsync=False))
    assert isinstance(store, LocalBlobStore)
    for bad in ("file://relative/path", "file://", "ftp://x/y", "/just/a/path"):
        with pytest.raises(ConfigError):
            open_store(bad)
