"""Serializers and the change codec round-trip and reject bad bytes."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstl_client.core.errors import CorruptObject, InvalidArgument
from dstl_client.state import changes as ch
from dstl_client.state.serializers import (
    BOOL,
    BYTES,
    FLOAT64,
    INT64,
    JSON,
    PICKLE,
    STR,
    TupleSerializer,
    decode_varint,
    encode_varint,
)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int64(v: int) -> None:
    assert INT64.loads(INT64.dumps(v)) == v
    assert len(INT64.dumps(v)) == 8


def test_int64_out_of_range() -> None:
    with pytest.raises(InvalidArgument):
        INT64.dumps(2**63)


@given(st.floats(allow_nan=False))
def test_float64(v: float) -> None:
    assert FLOAT64.loads(FLOAT64.dumps(v)) == v


def test_float64_nan() -> None:
    assert math.isnan(FLOAT64.loads(FLOAT64.dumps(math.nan)))


@given(st.text())
def test_str(v: str) -> None:
    assert STR.loads(STR.dumps(v)) == v


@given(st.binary())
def test_bytes_and_bool(v: bytes) -> None:
    assert BYTES.loads(BYTES.dumps(v)) == v
    assert BOOL.loads(BOOL.dumps(bool(v))) is bool(v)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


@given(_json)
def test_json_is_canonical(v: Any) -> None:
    assert JSON.loads(JSON.dumps(v)) == v
    if isinstance(v, dict):
        assert JSON.dumps(dict(reversed(list(v.items())))) == JSON.dumps(v)


def test_pickle() -> None:
    v = {"a": (1, 2.5, {3})}
    assert PICKLE.loads(PICKLE.dumps(v)) == v


@given(st.integers(), st.text(), st.binary())
def test_tuple_nests_any_serializers(a: int, b: str, c: bytes) -> None:
    ser: TupleSerializer[Any] = TupleSerializer(JSON, STR, BYTES)
    assert ser.loads(ser.dumps((a, b, c))) == (a, b, c)


def test_tuple_rejects_wrong_arity_and_trailing_bytes() -> None:
    ser: TupleSerializer[Any] = TupleSerializer(STR, STR)
    with pytest.raises(InvalidArgument):
        ser.dumps(("a",))
    with pytest.raises(InvalidArgument):
        ser.loads(ser.dumps(("a", "b")) + b"x")


@given(st.integers(min_value=0, max_value=2**63))
def test_varint(n: int) -> None:
    data = encode_varint(n) + b"tail"
    assert decode_varint(data, 0) == (n, len(data) - 4)


def test_varint_truncated() -> None:
    with pytest.raises(InvalidArgument):
        decode_varint(b"\x80\x80", 0)


@given(st.text(min_size=1), st.binary(), st.binary(), st.binary())
def test_change_codec(name: str, key: bytes, suffix: bytes, value: bytes) -> None:
    prefix = ch.state_prefix(name.encode(), key)
    k = prefix + suffix
    assert ch.decode_state_key(k) == (name, key, suffix)
    assert ch.decode_change(ch.encode_put(k, value)) == (ch.OP_PUT, k, value)
    assert ch.decode_change(ch.encode_delete(k)) == (ch.OP_DELETE, k, b"")
    assert ch.decode_change(ch.encode_delete_prefix(prefix)) == (ch.OP_DELETE_PREFIX, prefix, b"")
    assert ch.decode_change(ch.encode_list_append(k, value)) == (ch.OP_LIST_APPEND, k, value)
    # every map entry of the key sorts inside [prefix, prefix_end)
    end = ch.prefix_end(prefix)
    assert end is None or prefix <= k < end


@given(st.lists(st.binary(), max_size=5))
def test_list_elements(items: list[bytes]) -> None:
    value = b"".join(ch.encode_element(e) for e in items)
    assert list(ch.iter_elements(value)) == items


def test_corrupt_changes_raise() -> None:
    for bad in (b"", b"\x09abc", b"\x01\x05ab", b"\x01\x80"):
        with pytest.raises(CorruptObject):
            ch.decode_change(bad)
    with pytest.raises(CorruptObject):
        list(ch.iter_elements(b"\x05ab"))


def test_prefix_end() -> None:
    assert ch.prefix_end(b"ab") == b"ac"
    assert ch.prefix_end(b"a\xff") == b"b"
    assert ch.prefix_end(b"\xff\xff") is None


@given(st.text(min_size=1), st.binary(), st.binary())
def test_map_entries_are_told_from_other_rows(name: str, key: bytes, map_key: bytes) -> None:
    value_row = ch.state_prefix(name.encode(), key)
    mp = ch.map_prefix(name.encode(), key)
    entry = mp + map_key
    assert ch.map_prefix_of(value_row) is None
    assert ch.map_prefix_of(entry) == mp
    assert ch.decode_state_key(entry) == (name, key, b"\x00" + map_key)
    # a map's entries never sort inside another key's rows
    assert not entry.startswith(ch.state_prefix(name.encode(), key + b"x"))
