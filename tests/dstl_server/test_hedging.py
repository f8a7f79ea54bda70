"""Hedging in UploadExecutor, LatencyTracker and HedgeBudget, on a fake clock.

The store's put latencies are scripted in virtual time (``FakeClock``), so the
elapsed times asserted here are exact and nothing sleeps on the wall clock.
"""

from __future__ import annotations

import asyncio

import pytest

from dstl_client.core.errors import StorageError, TransientStorageError
from dstl_server.hedging import HedgeBudget, LatencyTracker, make_uploader
from dstl_server.metrics import ServerMetrics
from dstl_server.settings import ServerSettings
from dstl_server.upload_policy import UploadPolicy
from dstl_server.uploader import UploadExecutor
from tests.fakes import MemoryBlobStore, latencies, sample


def policy(**kw: object) -> UploadPolicy:
    base: dict[str, object] = {
        "attempt_timeout_s": 5.0,
        "deadline_s": 10.0,
        "hedge_mode": "fixed",
        "hedge_delay_s": 0.05,
        "hedge_budget_fraction": 1.0,
        "retry_base_delay_s": 0.01,
        "retry_max_delay_s": 0.02,
    }
    base.update(kw)
    return UploadPolicy(**base)  # type: ignore[arg-type]


def engine(store: MemoryBlobStore, p: UploadPolicy, m: ServerMetrics) -> UploadExecutor:
    """The upload engine on the store's fake clock."""
    return UploadExecutor(store, p, m, clock=store.clock.time, sleep=store.clock.sleep)


DATA = b"x" * 1000


# ------------------------------------------------------------------ hedging
@pytest.mark.asyncio
async def test_slow_first_attempt_is_hedged_and_the_hedge_wins() -> None:
    store = MemoryBlobStore(plan=latencies(0.6, 0.01))
    m = ServerMetrics()
    up = engine(store, policy(hedge_delay_s=0.05), m)
    t0 = store.clock.time()
    key = await up.upload("job", DATA)
    took = store.clock.time() - t0
    first, hedge = store.put_keys
    assert key == hedge and key.startswith("job/")
    assert store.objects[key] == DATA  # the returned key names a complete object
    assert took < 0.4  # did not wait for the slow first attempt
    assert sample(m, "dstl_hedges_started_total") == 1
    assert sample(m, "dstl_hedges_won_total") == 1
    # The loser was not cancelled: it runs on, lands later, and is then deleted.
    assert first not in store.finished
    await up.close()
    assert first in store.finished and first not in store.cancelled
    assert first in store.deleted
    assert set(store.objects) == {key}
    assert sample(m, "dstl_upload_attempts_discarded_total") == 1
    assert up.pending_discards == 0


@pytest.mark.asyncio
async def test_first_attempt_wins_when_it_beats_its_hedge() -> None:
    # first takes 0.15 s, the hedge (started at 0.05 s) takes 0.5 s
    store = MemoryBlobStore(plan=latencies(0.15, 0.5))
    m = ServerMetrics()
    up = engine(store, policy(hedge_delay_s=0.05), m)
    key = await up.upload("job", DATA)
    first, hedge = store.put_keys
    assert key == first
    assert sample(m, "dstl_hedges_started_total") == 1
    assert sample(m, "dstl_hedges_won_total") == 0
    await up.close()
    assert hedge in store.deleted and set(store.objects) == {first}


@pytest.mark.asyncio
async def test_loser_that_fails_later_is_still_discarded() -> None:
    def plan(n: int) -> tuple[float, BaseException | None]:
        if n == 0:
            return 0.3, TransientStorageError("503 SlowDown")
        return 0.01, None

    store = MemoryBlobStore(plan=plan)
    up = engine(store, policy(hedge_delay_s=0.05), ServerMetrics())
    key = await up.upload("job", DATA)
    await up.close()
    assert key == store.put_keys[1]
    assert store.put_keys[0] in store.deleted
    assert set(store.objects) == {key}


@pytest.mark.asyncio
async def test_fast_uploads_are_not_hedged() -> None:
    store = MemoryBlobStore(plan=latencies(then=0.005))
    m = ServerMetrics()
    up = engine(store, policy(hedge_delay_s=0.2), m)
    keys = [await up.upload("job", DATA) for _ in range(5)]
    assert keys == store.put_keys
    assert sample(m, "dstl_hedges_started_total") == 0
    assert sample(m, "dstl_upload_attempts_count") == 5
    assert sample(m, "dstl_upload_attempts_sum") == 5


@pytest.mark.asyncio
async def test_off_mode_never_hedges() -> None:
    store = MemoryBlobStore(plan=latencies(0.3))
    m = ServerMetrics()
    up = engine(store, policy(hedge_mode="off"), m)
    assert up.hedge_delay(len(DATA)) is None
    key = await up.upload("job", DATA)
    assert store.put_keys == [key]
    assert sample(m, "dstl_hedges_started_total") == 0


def test_make_uploader_picks_by_mode(tmp_path: object) -> None:
    # one engine for every mode; the mode is the policy's
    store = MemoryBlobStore(plan=latencies())
    m = ServerMetrics()
    s = ServerSettings(storage="file:///tmp/x")
    for mode, settings in (
        ("adaptive", s),
        ("fixed", s.replace(hedge_mode="fixed")),
        ("off", s.replace(hedge_mode="off")),
    ):
        up = make_uploader(store, settings, m)
        assert isinstance(up, UploadExecutor) and up.policy.hedge_mode == mode
    p = UploadPolicy.from_settings(s.replace(hedge_delay_ms=250.0, upload_deadline_s=7.0))
    assert p.hedge_delay_s == 0.25 and p.deadline_s == 7.0 and p.hedge_mode == "adaptive"
    assert UploadPolicy.from_settings(s) == UploadPolicy()  # the defaults are the settings'


# ------------------------------------------------------------------- budget
def test_budget_allows_a_fraction_of_uploads_in_the_window() -> None:
    now = [1000.0]
    b = HedgeBudget(0.1, 60.0, clock=lambda: now[0])
    for _ in range(9):
        b.note_upload()
    assert not b.try_acquire()  # 1 > 0.1 * 9
    b.note_upload()
    assert b.try_acquire()  # 1 <= 0.1 * 10
    assert not b.try_acquire()
    for _ in range(10):
        b.note_upload()
    assert b.try_acquire() and not b.try_acquire()
    assert (b.uploads, b.hedges) == (20, 2)
    # the window slides: old uploads and hedges are forgotten
    now[0] += 30.0
    assert (b.uploads, b.hedges) == (20, 2)
    now[0] += 31.0
    assert (b.uploads, b.hedges) == (0, 0)
    b.note_upload()
    assert not b.try_acquire()


@pytest.mark.asyncio
async def test_budget_stops_hedging_when_spent() -> None:
    store = MemoryBlobStore(plan=latencies(then=0.12))  # every attempt is slower than the delay
    m = ServerMetrics()
    up = engine(store, policy(hedge_delay_s=0.02, hedge_budget_fraction=0.5), m)
    for _ in range(6):
        await up.upload("job", DATA)
    await up.close()
    # uploads 2, 4 and 6 may hedge (hedges + 1 <= 0.5 * uploads), 1, 3 and 5 may not
    assert sample(m, "dstl_hedges_started_total") == 3
    assert sample(m, "dstl_hedges_skipped_budget_total") == 3
    assert len(store.put_keys) == 9
    assert len(store.objects) == 6  # every loser deleted


@pytest.mark.asyncio
async def test_zero_budget_never_hedges() -> None:
    store = MemoryBlobStore(plan=latencies(then=0.08))
    m = ServerMetrics()
    up = engine(store, policy(hedge_delay_s=0.01, hedge_budget_fraction=0.0), m)
    for _ in range(3):
        await up.upload("job", DATA)
    assert len(store.put_keys) == 3
    assert sample(m, "dstl_hedges_skipped_budget_total") == 3


# ----------------------------------------------------------- adaptive delay
def test_latency_tracker_quantile_per_size_class() -> None:
    t = LatencyTracker(window=100, min_samples=10)
    for i in range(1, 10):
        t.record(1000, i / 1000)
    assert t.quantile(1000, 0.95) is None  # 9 < min_samples
    t.record(1000, 0.010)
    assert t.quantile(1000, 0.95) == pytest.approx(0.010)
    assert t.quantile(1000, 0.5) == pytest.approx(0.005)
    assert t.quantile(8 << 20, 0.95) is None  # another size class has no samples
    for i in range(1, 201):  # the window keeps the newest 100: 101..200 ms
        t.record(1000, i / 1000)
    assert t.count(1000) == 100
    assert t.quantile(1000, 0.0) == pytest.approx(0.101)
    assert t.quantile(1000, 0.95) == pytest.approx(0.195)
    assert t.quantile(1000, 1.0) == pytest.approx(0.200)


def test_adaptive_delay_follows_the_quantile_and_clamps() -> None:
    def uploader(lo: float, hi: float) -> UploadExecutor:
        p = policy(
            hedge_mode="adaptive",
            hedge_quantile=0.95,
            hedge_min_delay_s=lo,
            hedge_max_delay_s=hi,
            min_samples=20,
        )
        return engine(MemoryBlobStore(plan=latencies()), p, ServerMetrics())

    up = uploader(0.01, 1.0)
    assert up.hedge_delay(1000) == 1.0  # cold start: the ceiling
    for i in range(1, 101):
        up.latencies.record(1000, i / 1000)  # 1..100 ms
    assert up.hedge_delay(1000) == pytest.approx(0.095)
    assert up.hedge_delay(10 << 20) == 1.0  # big objects: still cold
    up2 = uploader(0.01, 0.05)
    up3 = uploader(0.2, 1.0)
    for u in (up2, up3):
        for i in range(1, 101):
            u.latencies.record(1000, i / 1000)
    assert up2.hedge_delay(1000) == 0.05  # clamped to the ceiling
    assert up3.hedge_delay(1000) == 0.2  # clamped to the floor


@pytest.mark.asyncio
async def test_adaptive_hedging_learns_from_uploads() -> None:
    # 30 fast uploads teach a ~10 ms p95; then a 1 s put is hedged after the floor, not the
    # 2 s cold-start ceiling
    store = MemoryBlobStore(plan=latencies(*([0.01] * 30), 1.0, then=0.01))
    m = ServerMetrics()
    p = policy(hedge_mode="adaptive", hedge_min_delay_s=0.05, hedge_max_delay_s=2.0, min_samples=20)
    up = engine(store, p, m)
    for _ in range(30):
        await up.upload("job", DATA)
    assert up.hedge_delay(len(DATA)) == 0.05
    t0 = store.clock.time()
    key = await up.upload("job", DATA)
    assert store.clock.time() - t0 < 0.5
    assert key == store.put_keys[-1] and sample(m, "dstl_hedges_won_total") == 1
    assert sample(m, "dstl_hedge_delay_seconds") == 0.05
    await up.close()


# ------------------------------------------------------------------ retries
@pytest.mark.asyncio
async def test_retryable_failure_is_retried() -> None:
    def plan(n: int) -> tuple[float, BaseException | None]:
        return (0.0, TransientStorageError("503 SlowDown")) if n < 2 else (0.0, None)

    store = MemoryBlobStore(plan=plan)
    m = ServerMetrics()
    up = engine(store, policy(max_attempts=3), m)
    key = await up.upload("job", DATA)
    await up.close()
    assert len(store.put_keys) == 3 and key == store.put_keys[2]
    assert sample(m, "dstl_upload_retries_total") == 2
    assert sample(m, "dstl_storage_failures_total", op="put", kind="storage_transient") == 2
    # failed attempts' keys are deleted too (a failed put may have landed)
    assert set(store.put_keys[:2]) <= set(store.deleted)
    assert set(store.objects) == {key}


@pytest.mark.asyncio
async def test_attempt_timeout_is_retried() -> None:
    store = MemoryBlobStore(plan=latencies(5.0, then=0.0))
    m = ServerMetrics()
    up = engine(store, policy(hedge_mode="off", attempt_timeout_s=0.1), m)
    key = await up.upload("job", DATA)
    assert key == store.put_keys[1]
    assert store.put_keys[0] in store.cancelled
    assert sample(m, "dstl_storage_failures_total", op="put", kind="timeout") == 1
    await up.close()
    assert store.put_keys[0] in store.deleted


@pytest.mark.asyncio
async def test_non_retryable_failure_is_not_retried() -> None:
    store = MemoryBlobStore(plan=lambda n: (0.0, StorageError("403 AccessDenied", retryable=False)))
    m = ServerMetrics()
    up = engine(store, policy(max_attempts=5), m)
    with pytest.raises(StorageError, match="403 AccessDenied") as info:
        await up.upload("job", DATA)
    assert not info.value.retryable
    assert len(store.put_keys) == 1
    assert sample(m, "dstl_upload_retries_total") == 0
    assert sample(m, "dstl_uploads_total", result="failed") == 1
    assert sample(m, "dstl_upload_failures_total", kind="storage") == 1
    await up.close()  # the failed attempt's delete waits on the fake clock: let it run


@pytest.mark.asyncio
async def test_retries_stop_after_max_attempts() -> None:
    store = MemoryBlobStore(plan=lambda n: (0.0, TransientStorageError("500 InternalError")))
    up = engine(store, policy(max_attempts=3), ServerMetrics())
    with pytest.raises(TransientStorageError, match=r"after 3 attempt\(s\).*500 InternalError"):
        await up.upload("job", DATA)
    assert len(store.put_keys) == 3
    await up.close()
    assert store.objects == {}


@pytest.mark.asyncio
async def test_deadline_bounds_the_upload() -> None:
    store = MemoryBlobStore(plan=latencies(then=3.0))  # the store hangs
    m = ServerMetrics()
    up = engine(store, policy(deadline_s=0.4, attempt_timeout_s=1.0, hedge_delay_s=0.1), m)
    t0 = store.clock.time()
    with pytest.raises(TransientStorageError, match=r"missed its 0\.4s deadline"):
        await up.upload("job", DATA)
    assert 0.35 < store.clock.time() - t0 < 0.9
    assert sample(m, "dstl_upload_deadline_exceeded_total") == 1
    assert sample(m, "dstl_upload_failures_total", kind="deadline") == 1
    assert len(store.put_keys) == 2  # the first attempt and its hedge
    # the abandoned attempts end at their own timeout and are deleted
    await up.close()
    assert set(store.put_keys) <= set(store.deleted)
    assert store.objects == {}


@pytest.mark.asyncio
async def test_close_cancels_discards_past_its_timeout() -> None:
    store = MemoryBlobStore(plan=latencies(0.5, 0.01))
    up = engine(store, policy(hedge_delay_s=0.05, attempt_timeout_s=30.0), ServerMetrics())
    await up.upload("job", DATA)
    await up.close(timeout_s=0.05)
    assert up.pending_discards == 0
    assert store.put_keys[0] in store.cancelled and store.put_keys[0] in store.deleted


@pytest.mark.asyncio
async def test_cancelled_upload_discards_its_attempts() -> None:
    store = MemoryBlobStore(plan=latencies(0.2, 0.2))
    up = engine(store, policy(hedge_delay_s=0.05), ServerMetrics())
    task = asyncio.ensure_future(up.upload("job", DATA))
    await store.clock.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await up.close()
    assert len(store.put_keys) == 2
    assert set(store.put_keys) <= set(store.deleted) and store.objects == {}


@pytest.mark.asyncio
async def test_delete_of_a_landed_loser_is_retried() -> None:
    store = MemoryBlobStore(plan=latencies(0.2, 0.01))
    store.fail_deletes = 2
    m = ServerMetrics()
    up = engine(store, policy(hedge_delay_s=0.05), m)
    key = await up.upload("job", DATA)
    await up.close()
    assert store.delete_calls == 3
    assert set(store.objects) == {key}
    assert sample(m, "dstl_upload_attempts_discarded_total") == 1
    assert sample(m, "dstl_upload_discard_failures_total") == 0


@pytest.mark.asyncio
async def test_failed_attempts_are_deleted_in_one_try() -> None:
    # every put fails: nothing landed, so one batched delete, not retried when it fails
    store = MemoryBlobStore(plan=lambda n: (0.0, TransientStorageError("503 SlowDown")))
    store.fail_deletes = 1
    m = ServerMetrics()
    up = engine(store, policy(max_attempts=3), m)
    with pytest.raises(TransientStorageError):
        await up.upload("job", DATA)
    await up.close()
    assert store.delete_calls == 1
    assert sample(m, "dstl_upload_discard_failures_total") == 3
    assert sample(m, "dstl_storage_failures_total", op="delete", kind="storage_transient") == 1


@pytest.mark.asyncio
async def test_losers_of_many_uploads_are_deleted_in_one_request() -> None:
    # three uploads, each first attempt slow (0.15 s) and hedged after 0.02 s
    store = MemoryBlobStore(plan=lambda n: (0.15 if n % 2 == 0 else 0.005, None))
    m = ServerMetrics()
    up = engine(store, policy(hedge_delay_s=0.02, discard_batch_delay_s=0.6), m)
    keys = [await up.upload("job", DATA) for _ in range(3)]
    assert keys == store.put_keys[1::2]
    await store.clock.sleep(0.2)  # every loser has landed; the batch is not due yet
    assert store.delete_calls == 0 and len(store.objects) == 6
    await store.clock.sleep(0.8)
    assert store.delete_calls == 1 and set(store.deleted) == set(store.put_keys[0::2])
    assert set(store.objects) == set(keys)
    assert sample(m, "dstl_upload_attempts_discarded_total") == 3
    await up.close()
    assert store.delete_calls == 1
