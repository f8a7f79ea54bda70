"""The single-key backend: the keyed state API on it, resets, key order, and parity with the
keyed (SQLite) backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstl_client.bounded import KeyOrderError, SingleKeyBackend, as_keyed_backend
from dstl_client.core.errors import InvalidArgument
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.api import KeyedContext
from dstl_client.state.backend import KeyedStateBackend
from dstl_client.state.serializers import INT64, JSON, STR
from dstl_client.state.store import LocalKeyedStore


def _ctx(check_order: bool = True) -> tuple[KeyedContext, SingleKeyBackend]:
    backend = SingleKeyBackend(check_order=check_order)
    return KeyedContext(as_keyed_backend(backend)), backend


def test_every_keyed_state_kind_works_and_is_reset_when_the_key_changes() -> None:
    ctx, backend = _ctx()
    v = ctx.value_state("v", INT64)
    lst = ctx.list_state("l", STR)
    m = ctx.map_state("m", STR, JSON)
    r = ctx.reducing_state("r", lambda a, b: a + b, INT64)
    backend.start_key("alice")
    assert v.value() is None and lst.get() == [] and m.is_empty() and r.get() is None
    v.update(5)
    lst.add("x")
    lst.add_all(["y", "z"])
    m.put("b", [1])
    m.put("a", {"k": 2})
    m.put_all({"c": 3})
    r.add(3)
    r.add(4)
    assert v.value() == 5
    assert lst.get() == ["x", "y", "z"]
    assert list(m.items()) == [("a", {"k": 2}), ("b", [1]), ("c", 3)]
    assert m.get("b") == [1] and m.contains("a") and not m.contains("zz")
    assert r.get() == 7
    m.remove("b")
    assert list(m.keys()) == ["a", "c"] and list(m.values()) == [{"k": 2}, 3]
    lst.update(["only"])
    assert lst.get() == ["only"]
    assert backend.held_rows == 5  # value, list, reducing, two map entries
    # the next key starts empty: the previous key's state is gone for good
    backend.start_key("bob")
    assert backend.held_rows == 0
    assert v.value() is None and lst.get() == [] and m.is_empty() and r.get() is None
    v.update(7)
    m.put("z", 1)
    m.clear()
    assert m.is_empty() and list(m.items()) == []
    v.update(None)  # type: ignore[arg-type]
    assert v.value() is None
    backend.end_key()
    assert backend.held_rows == 0 and backend.keys == 2 and backend.max_rows == 5


def test_keys_must_arrive_in_strictly_increasing_order() -> None:
    _, backend = _ctx()
    for k in ("a", "b", "ba", "c"):
        backend.start_key(k)
    with pytest.raises(KeyOrderError, match="not sorted by key"):
        backend.start_key("b")
    with pytest.raises(KeyOrderError, match="arrived again"):
        backend.start_key("c")
    with pytest.raises(KeyOrderError, match="keys of one type"):
        backend.start_key(3)
    ints = SingleKeyBackend()
    for i in (-5, 2, 10):  # numeric order, as Spark sorts an integer column
        ints.start_key(i)
    with pytest.raises(KeyOrderError):
        ints.start_key(9)
    # code point order is Spark's order of UTF-8 bytes
    strs = SingleKeyBackend()
    for k in ("Z", "a", "é", "中", "😀"):
        strs.start_key(k)
        assert [k] == sorted([k])
    assert sorted(s.encode() for s in ("Z", "a", "é", "中", "😀")) == [
        s.encode() for s in ("Z", "a", "é", "中", "😀")
    ]
    trusting = SingleKeyBackend(check_order=False)
    trusting.start_key("b")
    trusting.start_key("a")
    assert trusting.current_key == "a"
    # KeyOrderError is an InvalidArgument: callers catching dstl's errors see it
    assert issubclass(KeyOrderError, InvalidArgument)


def test_user_code_cannot_switch_the_current_key() -> None:
    ctx, backend = _ctx()
    with pytest.raises(KeyOrderError, match="runner sets the key"):
        ctx.set_current_key("a")  # no key yet
    backend.start_key("a")
    ctx.set_current_key("a")  # the current key: nothing changes
    with pytest.raises(KeyOrderError, match="runner sets the key"):
        ctx.set_current_key("b")
    assert ctx.current_key == "a"
    with pytest.raises(InvalidArgument):
        backend.set_current_key_group(3)
    backend.set_current_key_group(0)


def test_scans_and_map_members_see_the_current_key_only() -> None:
    backend = SingleKeyBackend()
    backend.start_key(1)
    backend.put(b"a1", b"x")
    backend.map_put(b"m", b"m1", b"y")
    backend.map_put(b"m", b"m0", b"z")
    backend.list_append(b"l", b"\x01a")
    backend.list_append(b"l", b"\x01b")
    assert backend.get(b"l") == b"\x01a\x01b"
    assert backend.scan_range(0, b"a", b"b") == [(b"a1", b"x")]
    assert backend.scan_range(0, b"m", None) == [(b"m0", b"z"), (b"m1", b"y")]
    assert list(backend.iter_map(b"m")) == [(b"m0", b"z"), (b"m1", b"y")]
    assert backend.map_members(b"m") == {b"m0", b"m1"}
    backend.map_delete(b"m", b"m0")
    assert list(backend.iter_map(b"m")) == [(b"m1", b"y")]
    backend.delete_prefix(b"m")
    assert backend.get(b"m1") is None and not backend.map_members(b"m")
    backend.flush()
    backend.flush_log()
    backend.start_key(2)
    assert backend.scan_range(0, b"", None) == []


# ------------------------------------------------------------ parity, property-based
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("value"), st.integers(-3, 3)),
        st.tuples(st.just("clear_value"), st.none()),
        st.tuples(st.just("list_add"), st.text(max_size=3)),
        st.tuples(st.just("list_update"), st.lists(st.text(max_size=2), max_size=3)),
        st.tuples(st.just("map_put"), st.tuples(st.sampled_from("abc"), st.integers(0, 9))),
        st.tuples(st.just("map_remove"), st.sampled_from("abc")),
        st.tuples(st.just("map_clear"), st.none()),
        st.tuples(st.just("reduce"), st.integers(0, 5)),
    ),
    max_size=12,
)


def _apply(ctx: KeyedContext, op: str, arg: Any) -> None:
    v = ctx.value_state("v", INT64)
    lst = ctx.list_state("l", STR)
    m = ctx.map_state("m", STR, INT64)
    r = ctx.reducing_state("r", max, INT64)
    if op == "value":
        v.update(arg)
    elif op == "clear_value":
        v.clear()
    elif op == "list_add":
        lst.add(arg)
    elif op == "list_update":
        lst.update(arg)
    elif op == "map_put":
        m.put(*arg)
    elif op == "map_remove":
        m.remove(arg)
    elif op == "map_clear":
        m.clear()
    else:
        r.add(arg)


def _read(ctx: KeyedContext) -> tuple[Any, ...]:
    m = ctx.map_state("m", STR, INT64)
    return (
        ctx.value_state("v", INT64).value(),
        ctx.list_state("l", STR).get(),
        list(m.items()),
        m.is_empty(),
        ctx.reducing_state("r", max, INT64).get(),
    )


@pytest.mark.slow
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(per_key=st.lists(OPS, min_size=1, max_size=4))
def test_a_key_sees_the_same_state_as_on_the_keyed_backend(
    tmp_path: Path, per_key: list[list[tuple[str, Any]]]
) -> None:
    """Each key's ops from empty state: the single-key backend answers as the keyed one does
    for a key never seen before (that is what sorted input guarantees)."""
    single_ctx, single = _ctx()
    store_dir = tmp_path / f"store-{len(list(tmp_path.iterdir()))}"
    with LocalKeyedStore(store_dir, KeyGroupRange(0, 15)) as store:
        keyed = KeyedStateBackend(store, 16)
        keyed_ctx = KeyedContext(keyed)
        for i, ops in enumerate(per_key):
            key = f"k{i}"
            single.start_key(key)
            keyed_ctx.set_current_key(key)
            assert _read(single_ctx) == _read(keyed_ctx)
            for op, arg in ops:
                _apply(single_ctx, op, arg)
                _apply(keyed_ctx, op, arg)
                assert _read(single_ctx) == _read(keyed_ctx)
