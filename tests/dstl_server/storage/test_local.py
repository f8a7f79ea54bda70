"""The ``file://`` store: the blob store contract plus what only files can show."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from dstl_client.core.errors import BlobNotFound, ConfigError, StorageError
from dstl_server.settings import ServerSettings
from dstl_server.storage import LocalBlobStore, open_store
from dstl_server.storage.base import BlobStore
from tests.dstl_server.storage.contract import BlobStoreContract

TMP_SUFFIX = ".tmp-dstl"


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


class TestLocalBlobStore(BlobStoreContract):
    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[BlobStore]:
        async with LocalBlobStore(tmp_path / "objects", fsync=False) as s:
            yield s


class TestLocalBlobStoreFsync(BlobStoreContract):
    """The same contract with fsync on (the production setting)."""

    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[BlobStore]:
        async with LocalBlobStore(tmp_path / "objects", fsync=True) as s:
            yield s


@pytest.mark.asyncio
async def test_objects_are_plain_files_under_root(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "root")
    await store.put("job/ab/obj.dstl", b"payload")
    assert (tmp_path / "root" / "job" / "ab" / "obj.dstl").read_bytes() == b"payload"
    assert store.url == f"file://{(tmp_path / 'root').resolve()}"


@pytest.mark.asyncio
async def test_no_temp_files_left_after_puts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalBlobStore(root)
    for i in range(10):
        await store.put(f"j/{i % 3}/k{i}", os.urandom(1000 + i))
    await store.put("j/0/k0", b"overwritten")
    assert not [f for f in _files(root) if f.endswith(TMP_SUFFIX)]
    assert len(_files(root)) == 10


@pytest.mark.asyncio
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
@pytest.mark.asyncio
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


@pytest.mark.asyncio
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


# ------------------------------------------------ leftovers of interrupted writes
def _plant_leftover(path: Path, data: bytes = b"half an object", age_s: float = 0.0) -> Path:
    """A temp file as ``put`` names it, as a process killed mid-write leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def _temp_files(root: Path) -> list[str]:
    return [f for f in _files(root) if f.endswith(TMP_SUFFIX)]


@pytest.mark.asyncio
async def test_sweep_at_age_zero_removes_every_leftover(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalBlobStore(root, fsync=False)
    await store.put("job/00/done.dstl", b"complete")
    await store.put("top", b"top-level object")
    for rel in (
        f"job/00/.crashed.dstl.0123abcd{TMP_SUFFIX}",
        f"job/ff/.other.dstl.89abcdef{TMP_SUFFIX}",
        f".top.deadbeef{TMP_SUFFIX}",
        f"a/b/c/d/.deep.00000000{TMP_SUFFIX}",
    ):
        _plant_leftover(root / rel)
    assert len(_temp_files(root)) == 4
    assert await store.sweep_leftovers(0.0) == 4
    assert _temp_files(root) == []
    # objects, including ones whose names merely look similar, stay
    assert _files(root) == ["job/00/done.dstl", "top"]
    assert await store.get("job/00/done.dstl") == b"complete"
    assert await store.sweep_leftovers(0.0) == 0


@pytest.mark.asyncio
async def test_sweep_keeps_temp_files_younger_than_the_age(tmp_path: Path) -> None:
    """A write in progress (a fresh temp file) is never touched by the periodic sweep."""
    root = tmp_path / "root"
    store = LocalBlobStore(root, fsync=False)
    old = _plant_leftover(root / f"j/.old.dstl.11111111{TMP_SUFFIX}", age_s=600)
    fresh = _plant_leftover(root / f"j/.fresh.dstl.22222222{TMP_SUFFIX}")
    assert await store.sweep_leftovers(300.0) == 1
    assert not old.exists() and fresh.exists()


@pytest.mark.asyncio
async def test_sweep_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "root", fsync=False)
    (tmp_path / "root").rmdir()
    assert await store.sweep_leftovers(0.0) == 0


@pytest.mark.asyncio
async def test_sweep_does_not_follow_symlinks_out_of_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    store = LocalBlobStore(root, fsync=False)
    foreign = _plant_leftover(outside / f".not.ours.12345678{TMP_SUFFIX}")
    (root / "link").symlink_to(outside, target_is_directory=True)
    assert await store.sweep_leftovers(0.0) == 0
    assert foreign.exists()


_KILLED_WRITER = """
import os, sys, time
from pathlib import Path
import asyncio
from dstl_server.storage.local import LocalBlobStore

def stuck_replace(src, dst):
    print("WRITTEN", flush=True)
    time.sleep(600)  # stuck until the test kills this process

os.replace = stuck_replace
asyncio.run(LocalBlobStore(sys.argv[1], fsync=False).put("job/00/obj.dstl", os.urandom(1 << 20)))
"""


def test_write_of_a_killed_process_is_swept_by_the_next_one(tmp_path: Path) -> None:
    """SIGKILL between writing the temp file and the rename: the next store removes it."""
    root = tmp_path / "root"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "WRITTEN"
    finally:
        proc.kill()
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()
    (left,) = _temp_files(root)
    assert (root / left).stat().st_size == 1 << 20

    async def reopen() -> tuple[list[str], int]:
        store = LocalBlobStore(root, fsync=False)
        listed = [i.key async for i in store.list("")]
        return listed, await store.sweep_leftovers(0.0)

    listed, removed = asyncio.run(reopen())
    assert listed == []  # never mistaken for an object
    assert removed == 1
    assert _files(root) == []


# ------------------------------------------------------------------- probe
@pytest.mark.asyncio
async def test_probe_writes_and_removes_a_temp_named_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe really writes (os.access is always true for root), under a temp name
    that is never listed and that a sweep removes if the probe dies half way."""
    root = tmp_path / "root"
    store = LocalBlobStore(root, fsync=False)
    opened: list[str] = []
    real_open = os.open

    def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr("dstl_server.storage.local.os.open", spy)
    await store.probe()
    (probe_file,) = opened
    assert Path(probe_file).parent == root.resolve()
    assert Path(probe_file).name.startswith(".") and probe_file.endswith(TMP_SUFFIX)
    assert _files(root) == []


@pytest.mark.asyncio
async def test_probe_recreates_a_missing_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalBlobStore(root, fsync=False)
    root.rmdir()
    await store.probe()
    assert root.is_dir()
    await store.put("k", b"v")


@pytest.mark.asyncio
async def test_probe_fails_when_the_root_is_a_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalBlobStore(root, fsync=False)
    root.rmdir()
    root.write_bytes(b"not a directory")
    with pytest.raises(StorageError) as info:
        await store.probe()
    assert info.value.retryable
    assert str(root) in info.value.message


@pytest.mark.asyncio
async def test_probe_fails_when_the_root_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_bytes(b"a file where a directory should be")
    store = LocalBlobStore(tmp_path / "ok", fsync=False)
    store.root = tmp_path / "blocker" / "root"
    with pytest.raises(StorageError):
        await store.probe()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
@pytest.mark.asyncio
async def test_probe_fails_when_the_root_is_read_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalBlobStore(root, fsync=False)
    root.chmod(0o555)
    try:
        with pytest.raises(StorageError):
            await store.probe()
    finally:
        root.chmod(0o755)
    await store.probe()


@pytest.mark.asyncio
async def test_probe_fails_when_writes_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full or read-only file system (as root too): the probe's write fails."""
    store = LocalBlobStore(tmp_path / "root", fsync=False)

    def enospc(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("dstl_server.storage.local.os.write", enospc)
    with pytest.raises(StorageError, match="No space left"):
        await store.probe()
    monkeypatch.undo()
    assert _files(tmp_path / "root") == []  # the failed probe cleaned up after itself
