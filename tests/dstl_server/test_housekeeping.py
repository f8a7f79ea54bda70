"""StoreHousekeeping: health follows the store; leftovers of interrupted writes go away.

A real :class:`LocalBlobStore` under ``tmp_path``; a store that is down is a
root directory replaced by a file (that fails for root too). Also an S3 store
where nothing listens, and one on SeaweedFS. Probe rounds are driven by
:class:`Ticker` instead of wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from dstl_client.core.errors import StorageError, TransientStorageError
from dstl_server.housekeeping import StoreHousekeeping
from dstl_server.metrics import ServerMetrics
from dstl_server.storage import LocalBlobStore
from dstl_server.storage.s3 import S3BlobStore
from tests.fakes import sample

TMP_SUFFIX = ".tmp-dstl"


class Ticker:
    """An injectable ``sleep``: each :meth:`step` lets exactly one probe round run."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self._go: asyncio.Queue[None] = asyncio.Queue()
        self._sleeping = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        self._sleeping.set()
        await self._go.get()
        self._sleeping.clear()

    async def wait_sleeping(self) -> None:
        await asyncio.wait_for(self._sleeping.wait(), 10)

    async def step(self, rounds: int = 1) -> None:
        """Run ``rounds`` probe rounds and return once the loop sleeps again."""
        for _ in range(rounds):
            await self.wait_sleeping()
            self._sleeping.clear()
            self._go.put_nowait(None)
            await self.wait_sleeping()


class Health:
    """Records ``on_health`` calls."""

    def __init__(self) -> None:
        self.calls: list[bool] = []
        self.changed = asyncio.Event()

    async def __call__(self, up: bool) -> None:
        self.calls.append(up)
        self.changed.set()


def leftover(path: Path, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"half an object")
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith(TMP_SUFFIX))


def break_store(root: Path) -> None:
    """The store goes away: its root is replaced by a plain file."""
    shutil.rmtree(root)
    root.write_bytes(b"not a directory")


def repair_store(root: Path) -> None:
    root.unlink()
    root.mkdir()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "objects"


@pytest.fixture
def store(root: Path) -> LocalBlobStore:
    return LocalBlobStore(root, fsync=False)


@pytest.fixture
def metrics() -> ServerMetrics:
    return ServerMetrics()


def make(
    store: LocalBlobStore,
    metrics: ServerMetrics,
    health: Health,
    ticker: Ticker,
    **kwargs: float,
) -> StoreHousekeeping:
    opts: dict[str, float] = {"probe_interval_s": 5.0, "leftover_age_s": 60.0, "sweep_every": 3}
    opts.update(kwargs)
    return StoreHousekeeping(
        store,
        on_health=health,
        metrics=metrics,
        probe_interval_s=opts["probe_interval_s"],
        leftover_age_s=opts["leftover_age_s"],
        sweep_every=int(opts["sweep_every"]),
        probe_timeout_s=opts.get("probe_timeout_s", 5.0),
        sleep=ticker.sleep,
    )


@pytest.mark.asyncio
async def test_start_probes_and_removes_every_leftover_at_once(
    store: LocalBlobStore, root: Path, metrics: ServerMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    await store.put("job/00/obj.dstl", b"complete")
    for rel in ("job/00/.a.dstl.00000001", "job/01/.b.dstl.00000002", ".c.00000003"):
        leftover(root / (rel + TMP_SUFFIX))  # fresh: age 0 still goes at start
    health, ticker = Health(), Ticker()
    hk = make(store, metrics, health, ticker)
    caplog.set_level(logging.INFO, logger="dstl_server.housekeeping")
    await hk.start()
    try:
        assert health.calls == [True]
        assert hk.up is True
        assert temp_files(root) == []
        assert await store.get("job/00/obj.dstl") == b"complete"
        assert sample(metrics, "dstl_store_up") == 1
        assert sample(metrics, "dstl_leftover_temp_files_removed_total") == 3
        assert sample(metrics, "dstl_store_probe_failures_total") == 0
        lines = [r.getMessage() for r in caplog.records if "leftover" in r.getMessage()]
        assert len(lines) == 1 and "3" in lines[0] and str(root) in lines[0]
        # the loop then sleeps the probe interval
        await ticker.wait_sleeping()
        assert ticker.asked == [5.0]
    finally:
        await hk.stop()


@pytest.mark.asyncio
async def test_health_changes_only_on_transitions(
    store: LocalBlobStore, root: Path, metrics: ServerMetrics
) -> None:
    health, ticker = Health(), Ticker()
    hk = make(store, metrics, health, ticker)
    await hk.start()
    try:
        await ticker.step(3)
        assert health.calls == [True]
        break_store(root)
        await ticker.step()
        assert health.calls == [True, False]
        assert hk.up is False
        assert sample(metrics, "dstl_store_up") == 0
        await ticker.step(2)
        assert health.calls == [True, False]  # still down: no repeated calls
        assert sample(metrics, "dstl_store_probe_failures_total") == 3
        assert isinstance(hk.last_error, StorageError)
        assert str(root) in hk.last_error.message
        repair_store(root)
        await ticker.step()
        assert health.calls == [True, False, True]
        assert hk.up is True and hk.last_error is None
        assert sample(metrics, "dstl_store_up") == 1
    finally:
        await hk.stop()


@pytest.mark.asyncio
async def test_store_down_at_start_is_reported_then_recovers_and_sweeps(
    store: LocalBlobStore, root: Path, metrics: ServerMetrics
) -> None:
    break_store(root)
    health, ticker = Health(), Ticker()
    hk = make(store, metrics, health, ticker)
    await hk.start()
    try:
        assert health.calls == [False]
        assert sample(metrics, "dstl_store_up") == 0
        assert sample(metrics, "dstl_store_probe_failures_total") == 1
        await ticker.step()
        assert health.calls == [False]
        # The store comes back with leftovers of an earlier process: the start
        # sweep (every temp file, whatever its age) runs with the first answer.
        repair_store(root)
        leftover(root / f"j/.x.dstl.12345678{TMP_SUFFIX}")
        await ticker.step()
        assert health.calls == [False, True]
        assert temp_files(root) == []
        assert sample(metrics, "dstl_leftover_temp_files_removed_total") == 1
    finally:
        await hk.stop()


@pytest.mark.asyncio
async def test_periodic_sweep_removes_only_old_leftovers(
    store: LocalBlobStore, root: Path, metrics: ServerMetrics
) -> None:
    health, ticker = Health(), Ticker()
    hk = make(store, metrics, health, ticker, sweep_every=3, leftover_age_s=60.0)
    await hk.start()
    try:
        old = leftover(root / f"a/.old.dstl.00000001{TMP_SUFFIX}", age_s=600)
        in_progress = leftover(root / f"a/.new.dstl.00000002{TMP_SUFFIX}")
        await ticker.step(2)
        assert old.exists()  # not a sweep round yet
        await ticker.step()
        assert not old.exists()
        assert in_progress.exists()  # younger than leftover_age_s: a write in progress
        assert sample(metrics, "dstl_leftover_temp_files_removed_total") == 1
        # no sweep while the store is down, and the loop goes on
        break_store(root)
        await ticker.step(3)
        repair_store(root)
        leftover(root / f".older.00000003{TMP_SUFFIX}", age_s=600)
        await ticker.step(3)
        assert temp_files(root) == []
        assert sample(metrics, "dstl_leftover_temp_files_removed_total") == 2
    finally:
        await hk.stop()


@pytest.mark.asyncio
async def test_a_hanging_probe_counts_as_down(
    root: Path, metrics: ServerMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    class HangingStore(LocalBlobStore):
        hang = False

        async def probe(self) -> None:
            if self.hang:
                await asyncio.Event().wait()
            await super().probe()

    store = HangingStore(root, fsync=False)
    health, ticker = Health(), Ticker()
    hk = make(store, metrics, health, ticker, probe_timeout_s=0.05)
    await hk.start()
    try:
        store.hang = True
        await ticker.step()
        assert health.calls == [True, False]
        assert "did not answer within" in str(hk.last_error)
        store.hang = False
        await ticker.step()
        assert health.calls == [True, False, True]
    finally:
        await hk.stop()


@pytest.mark.asyncio
async def test_failing_sweep_or_health_callback_does_not_stop_the_loop(
    store: LocalBlobStore,
    root: Path,
    metrics: ServerMetrics,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[bool] = []

    async def flaky_health(up: bool) -> None:
        calls.append(up)
        if len(calls) == 2:
            raise RuntimeError("health servicer hiccup")

    async def bad_sweep(older_than_s: float) -> int:
        raise StorageError("sweep failed", retryable=True)

    monkeypatch.setattr(store, "sweep_leftovers", bad_sweep)
    ticker = Ticker()
    hk = StoreHousekeeping(
        store,
        on_health=flaky_health,
        metrics=metrics,
        probe_interval_s=1.0,
        leftover_age_s=60.0,
        sweep_every=1,
        sleep=ticker.sleep,
    )
    await hk.start()  # the failed start sweep is logged, health is still up
    try:
        assert calls == [True]
        break_store(root)
        await ticker.step()
        assert calls == [True, False]  # raised: logged, the loop goes on
        repair_store(root)
        await ticker.step()
        assert calls == [True, False, True]
        assert "health servicer hiccup" in caplog.text
        assert "sweep failed" in caplog.text
    finally:
        await hk.stop()


@pytest.mark.asyncio
async def test_stop_cancels_the_task_and_is_idempotent(
    store: LocalBlobStore, metrics: ServerMetrics
) -> None:
    health = Health()
    # never started: stop is a no-op
    await StoreHousekeeping(store, on_health=health).stop()
    hk = StoreHousekeeping(
        store, on_health=health, metrics=metrics, probe_interval_s=3600, leftover_age_s=60
    )
    await hk.start()
    task = hk.task
    assert task is not None and not task.done()
    await asyncio.wait_for(hk.stop(), 5)  # cancels the hour-long sleep at once
    assert task.done() and hk.task is None
    await hk.stop()
    with pytest.raises(RuntimeError):
        await hk.start()  # one life only


@pytest.mark.asyncio
async def test_real_sleep_with_a_tiny_interval(store: LocalBlobStore, root: Path) -> None:
    """The default sleep: the loop notices a broken store by itself."""
    health = Health()
    hk = StoreHousekeeping(store, on_health=health, probe_interval_s=0.01, leftover_age_s=60)
    await hk.start()
    try:
        health.changed.clear()
        break_store(root)
        await asyncio.wait_for(health.changed.wait(), 10)
        assert health.calls == [True, False]
    finally:
        await hk.stop()


def test_bad_arguments(store: LocalBlobStore) -> None:
    async def on_health(up: bool) -> None:
        pass

    for kwargs in (
        {"probe_interval_s": 0.0},
        {"leftover_age_s": -1.0},
        {"sweep_every": 0},
        {"probe_timeout_s": 0.0},
        {"sweep_timeout_s": 0.0},
    ):
        with pytest.raises(ValueError):
            StoreHousekeeping(store, on_health=on_health, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- S3
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.asyncio
async def test_s3_store_where_nothing_listens_is_down(metrics: ServerMetrics) -> None:
    store = S3BlobStore(
        "bucket",
        "p",
        endpoint_url=f"http://127.0.0.1:{_free_port()}",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region="us-east-1",
    )
    health, ticker = Health(), Ticker()
    hk = StoreHousekeeping(store, on_health=health, metrics=metrics, sleep=ticker.sleep)
    async with store:
        await hk.start()
        try:
            assert health.calls == [False]
            assert isinstance(hk.last_error, TransientStorageError)
            await ticker.step()
            assert health.calls == [False]
            assert sample(metrics, "dstl_store_probe_failures_total") == 2
        finally:
            await hk.stop()


@pytest.mark.s3
@pytest.mark.asyncio
async def test_s3_store_that_answers_is_up(s3_store: S3BlobStore, metrics: ServerMetrics) -> None:
    health, ticker = Health(), Ticker()
    hk = StoreHousekeeping(s3_store, on_health=health, metrics=metrics, sleep=ticker.sleep)
    await hk.start()
    try:
        await ticker.step(2)
        assert health.calls == [True]
        assert sample(metrics, "dstl_store_up") == 1
        assert sample(metrics, "dstl_leftover_temp_files_removed_total") == 0
    finally:
        await hk.stop()
