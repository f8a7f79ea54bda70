"""The node-local store: versions, copy-on-write batches, locking; the state API on it."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from dstl_client.core.errors import InvalidArgument, KeyGroupOutOfRange
from dstl_client.keygroups import KeyGroupRange, key_group_for_key
from dstl_client.state.api import KeyedContext
from dstl_client.state.backend import KeyedStateBackend
from dstl_client.state.serializers import INT64, JSON, STR
from dstl_client.state.store import NO_VERSION, LocalKeyedStore, read_all_rows
from dstl_client.state.store_dirs import StoreLocked, remove_overlapping_stores

MAX_P = 16
FULL = KeyGroupRange(0, MAX_P - 1)


def _ctx(store: LocalKeyedStore, **kw: int) -> tuple[KeyedContext, KeyedStateBackend]:
    backend = KeyedStateBackend(store, MAX_P, **kw)  # type: ignore[arg-type]
    return KeyedContext(backend, 0), backend


def test_value_list_map_reducing_states(tmp_path: Path) -> None:
    with LocalKeyedStore(tmp_path, FULL) as store:
        ctx, _backend = _ctx(store)
        ctx.set_current_key("alice")
        v = ctx.value_state("v", INT64)
        lst = ctx.list_state("l", STR)
        m = ctx.map_state("m", STR, JSON)
        r = ctx.reducing_state("r", lambda a, b: a + b, INT64)
        assert v.value() is None and lst.get() == [] and list(m.items()) == [] and r.get() is None
        v.update(5)
        lst.add("x")
        lst.add_all(["y", "z"])
        m.put("b", [1])
        m.put("a", {"k": 2})
        r.add(3)
        r.add(4)
        ctx.set_current_key("bob")
        assert v.value() is None and lst.get() == [] and m.is_empty() and r.get() is None
        v.update(7)
        ctx.set_current_key("alice")
        assert v.value() == 5
        assert lst.get() == ["x", "y", "z"]
        assert list(m.items()) == [("a", {"k": 2}), ("b", [1])]
        assert m.get("b") == [1] and m.contains("a") and not m.contains("c")
        assert r.get() == 7
        m.remove("b")
        assert list(m.keys()) == ["a"]
        lst.update(["only"])
        assert lst.get() == ["only"]
        lst.update([])
        assert lst.get() == []
        v.update(None)  # type: ignore[arg-type]
        assert v.value() is None


def test_a_name_is_one_kind_of_state(tmp_path: Path) -> None:
    with LocalKeyedStore(tmp_path, FULL) as store:
        ctx, _ = _ctx(store)
        ctx.set_current_key("k")
        ctx.value_state("s", INT64)
        with pytest.raises(InvalidArgument):
            ctx.map_state("s", STR, STR)


def test_keys_outside_the_range_are_refused(tmp_path: Path) -> None:
    key = "some-key"
    kg = key_group_for_key(key, MAX_P)
    other = KeyGroupRange((kg + 1) % MAX_P, (kg + 1) % MAX_P)
    with LocalKeyedStore(tmp_path, other) as store:
        ctx, _ = _ctx(store)
        with pytest.raises(KeyGroupOutOfRange):
            ctx.set_current_key(key)


def _write(store: LocalKeyedStore, key: str, value: int, *, batch: int, attempt: str) -> None:
    ctx, backend = _ctx(store)
    ctx.set_current_key(key)
    ctx.value_state("v", INT64).update(value)
    store.begin()
    backend.flush()
    store.set_meta(delta_version=batch, delta_attempt=attempt)
    store.commit()


def _value(store: LocalKeyedStore, key: str) -> int | None:
    ctx, _ = _ctx(store)
    ctx.set_current_key(key)
    return ctx.value_state("v", INT64).value()


def test_a_batch_is_pending_until_merged_and_can_be_dropped(tmp_path: Path) -> None:
    with LocalKeyedStore(tmp_path, FULL) as store:
        assert store.main_version == (NO_VERSION, "")
        _write(store, "a", 1, batch=0, attempt="x")
        assert store.delta_version == (0, "x")
        assert _value(store, "a") is None  # main is still the old version
        store.merge_delta()
        assert store.main_version == (0, "x") and store.delta_version is None
        assert _value(store, "a") == 1
        kg = key_group_for_key("a", MAX_P)
        assert store.changed_key_groups() == {kg: 0}
        _write(store, "a", 2, batch=1, attempt="y")
        store.drop_delta()  # batch 1 was not committed: it is re-run from version 0
        assert _value(store, "a") == 1 and store.main_version == (0, "x")
    # versions survive reopening (another task on the node)
    with LocalKeyedStore(tmp_path, FULL) as store:
        assert store.main_version == (0, "x")
        assert _value(store, "a") == 1


def test_uncommitted_work_is_rolled_back_on_close(tmp_path: Path) -> None:
    with LocalKeyedStore(tmp_path, FULL) as store:
        ctx, backend = _ctx(store)
        ctx.set_current_key("a")
        ctx.value_state("v", INT64).update(1)
        store.begin()
        backend.flush()
        store.set_meta(delta_version=0, delta_attempt="x")
        # a crash before commit: nothing of it survives
    with LocalKeyedStore(tmp_path, FULL) as store:
        assert store.delta_version is None
        assert read_all_rows(store) == {}


def test_spilled_rows_are_read_back(tmp_path: Path) -> None:
    with LocalKeyedStore(tmp_path, FULL) as store:
        ctx, backend = _ctx(store, cache_rows=8)
        for i in range(50):
            ctx.set_current_key(f"k{i}")
            ctx.value_state("v", INT64).update(i)
            m = ctx.map_state("m", INT64, INT64)
            m.put(1, i)
            m.put(2, i)
        for i in range(50):
            ctx.set_current_key(f"k{i}")
            assert ctx.value_state("v", INT64).value() == i
            assert dict(ctx.map_state("m", INT64, INT64).items()) == {1: i, 2: i}
        ctx.set_current_key("k3")
        ctx.map_state("m", INT64, INT64).clear()
        assert list(ctx.map_state("m", INT64, INT64).items()) == []
        store.begin()
        backend.flush()
        store.set_meta(delta_version=0, delta_attempt="a")
        store.commit()
        store.merge_delta()
        assert len(read_all_rows(store)) == 50 + 49 * 2


def test_map_written_before_its_first_scan(tmp_path: Path) -> None:
    with LocalKeyedStore(tmp_path, FULL) as store:
        ctx, backend = _ctx(store)
        ctx.set_current_key("k")
        m = ctx.map_state("m", STR, INT64)
        m.put("a", 1)
        store.begin()
        backend.flush()
        store.set_meta(delta_version=0, delta_attempt="a")
        store.commit()
        store.merge_delta()
        ctx, _ = _ctx(store)
        ctx.set_current_key("k")
        m = ctx.map_state("m", STR, INT64)
        m.put("b", 2)
        m.remove("a")
        assert dict(m.items()) == {"b": 2}


def _hold_lock(
    path: str, started: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event
) -> None:
    with LocalKeyedStore(path, FULL):
        started.set()
        stop.wait(10)


def test_one_task_at_a_time(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    started, stop = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold_lock, args=(str(tmp_path), started, stop))
    p.start()
    try:
        assert started.wait(30)
        with pytest.raises(StoreLocked):
            LocalKeyedStore(tmp_path, FULL, lock_timeout_s=0.2)
    finally:
        stop.set()
        p.join(10)
    with LocalKeyedStore(tmp_path, FULL, lock_timeout_s=5):
        pass


def test_overlapping_stores_of_other_ranges_are_removed(tmp_path: Path) -> None:
    op = tmp_path / "op"
    for name in ("kg-0-7", "kg-8-15", "kg-0-4", "kg-5-15"):
        with LocalKeyedStore(op / name, FULL):
            pass
    removed = remove_overlapping_stores(op, KeyGroupRange(0, 4), keep=op / "kg-0-4")
    assert [(p.name, log_id) for p, log_id in removed] == [("kg-0-7", "")]
    assert sorted(p.name for p in op.iterdir()) == ["kg-0-4", "kg-5-15", "kg-8-15"]


def test_range_scans_see_the_pending_batch_and_this_tasks_writes(tmp_path: Path) -> None:
    """``scan_range``: one key group's rows in [start, end), the delta and dirty rows applied."""
    with LocalKeyedStore(tmp_path, FULL) as store:
        store.write_main([(3, b"a1", b"x"), (3, b"a2", b"y"), (3, b"b1", b"z"), (4, b"a3", b"w")])
        store.commit()
        store.write_delta([(3, b"a2", None), (3, b"a4", b"new")])
        assert store.scan_range(3, b"a", b"b", with_delta=False) == {b"a1": b"x", b"a2": b"y"}
        assert store.scan_range(3, b"a", b"b", with_delta=True) == {b"a1": b"x", b"a4": b"new"}
        assert store.scan_range(3, b"a2", None, with_delta=False) == {b"a2": b"y", b"b1": b"z"}
        backend = KeyedStateBackend(store, MAX_P)
        backend.set_current_key_group(3)
        backend.put(b"a0", b"dirty")  # in the cache only, until the scan writes it
        backend.delete(b"a1")
        # the pending batch of this task (the delta) is read back once rows were written to it
        assert backend.scan_range(3, b"a", b"b") == [(b"a0", b"dirty"), (b"a4", b"new")]
        assert backend.scan_range(4, b"", None) == [(b"a3", b"w")]
        with pytest.raises(KeyGroupOutOfRange):
            backend.scan_range(MAX_P, b"", None)
