"""The stored format of vectorized state: key bytes as every API's, values round-trip."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pytest

from dstl_client.core.errors import ConfigError, CorruptObject
from dstl_client.keygroups import key_bytes
from dstl_client.state.changes import decode_change, decode_state_key
from dstl_client.vectorized.apply import changes, encode_changes
from dstl_client.vectorized.keys import (
    MAX_MS,
    TIMER_INDEX_PREFIX,
    index_row_keys,
    key_bytes_of,
    keys_from_bytes,
    split_index_rows,
    state_row_keys,
)
from dstl_client.vectorized.values import ValueCodec

SCHEMA = pa.schema(
    [
        ("n", pa.int64()),
        ("s", pa.string()),
        ("ok", pa.bool_()),
        ("b", pa.binary()),
        ("t", pa.timestamp("us", tz="UTC")),
        ("d", pa.date32()),
        ("x", pa.float32()),
        ("i", pa.int8()),
    ]
)


def test_values_round_trip_with_nulls_and_expiry() -> None:
    t = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    rows = [
        {"n": 1, "s": "a", "ok": True, "b": b"", "t": t, "d": t.date(), "x": 1.5, "i": -3},
        {"n": None, "s": None, "ok": None, "b": None, "t": None, "d": None, "x": None, "i": None},
        {"n": -(2**63), "s": "é" * 300, "ok": False, "b": b"\x00" * 5, "t": t, "d": None,
         "x": 0.0, "i": 127},
    ]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    codec = ValueCodec(SCHEMA)
    values = codec.encode(table, np.array([5, MAX_MS, -7], np.int64))
    stored = pa.concat_arrays([values, pa.nulls(1, pa.binary())])
    columns, present, expiry = codec.decode(stored)
    back = pa.Table.from_arrays(columns, schema=SCHEMA).to_pylist()
    assert back[:3] == rows
    assert back[3] == dict.fromkeys(SCHEMA.names)
    assert present.tolist() == [True, True, True, False]
    assert expiry.tolist() == [5, MAX_MS, -7, MAX_MS]


def test_a_value_of_another_format_or_a_schema_of_other_types_is_refused() -> None:
    codec = ValueCodec(pa.schema([("n", pa.int64())]))
    with pytest.raises(CorruptObject):
        codec.decode(pa.array([b"\x07" + bytes(20)], pa.binary()))
    with pytest.raises(ConfigError, match="'m'"):
        ValueCodec(pa.schema([("m", pa.list_(pa.int64()))]))


def test_key_bytes_and_row_keys_are_those_of_the_per_key_apis() -> None:
    ints = pa.array([0, -12, 2**62], pa.int64())
    kb = key_bytes_of(ints)
    assert kb.to_pylist() == [key_bytes(k) for k in ints.to_pylist()]
    assert keys_from_bytes(kb, pa.int64()).equals(ints)
    strings = pa.array(["a", "ünï", "x" * 200])
    assert key_bytes_of(strings).to_pylist() == [key_bytes(k) for k in strings.to_pylist()]
    rows = state_row_keys(key_bytes_of(strings)).to_pylist()
    assert [decode_state_key(r)[:2] for r in rows] == [
        ("$vstate", key_bytes(k)) for k in strings.to_pylist()
    ]
    ms = pa.array([-5, 0, 7], pa.int64())
    index = index_row_keys(TIMER_INDEX_PREFIX, ms, kb)
    assert index.to_pylist() == sorted(index.to_pylist())  # time order is byte order
    back_ms, back_kb = split_index_rows(TIMER_INDEX_PREFIX, index)
    assert back_ms.equals(ms) and back_kb.equals(kb)


def test_logged_changes_decode_as_puts_and_deletes() -> None:
    k = pa.array([b"a", b"bb" * 100], pa.binary())
    for v in (pa.array([b"1", None], pa.binary()), None):
        table = changes(pa.array([0, 1], pa.int32()), k, v)
        decoded = [decode_change(r) for r in encode_changes(table).to_pylist()]
        want = [(1, b"a", b"1") if v is not None else (2, b"a", b""), (2, b"bb" * 100, b"")]
        assert decoded == want


def test_short_row_keys_are_encoded_by_arrow_kernels_alike() -> None:
    k = pa.array([b"a", b"bc"], pa.binary())
    table = changes(pa.array([3, 3], pa.int32()), k, pa.array([None, b"xyz"], pa.binary()))
    decoded = [decode_change(r) for r in encode_changes(table).to_pylist()]
    assert decoded == [(2, b"a", b""), (1, b"bc", b"xyz")]
