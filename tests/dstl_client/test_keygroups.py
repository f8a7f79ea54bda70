"""Key groups: the stable hash, Flink's range assignment, the SQL expressions."""

from __future__ import annotations

import itertools
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.keygroups import (
    KeyGroupRange,
    all_ranges,
    check_parallelism,
    key_bytes,
    key_group_for_key,
    key_group_range_for_operator,
    key_group_sql,
    operator_index_for_key_group,
    operator_index_sql,
)


def test_hash_is_crc32_of_the_utf8_string_form() -> None:
    assert key_group_for_key("user-1", 128) == zlib.crc32(b"user-1") % 128
    assert key_group_for_key("é€", 1000) == zlib.crc32("é€".encode()) % 1000
    # an int key hashes like its decimal string, as Spark's cast to string does
    assert key_group_for_key(12345, 128) == key_group_for_key("12345", 128)
    assert key_group_for_key(-7, 128) == zlib.crc32(b"-7") % 128
    assert key_bytes(b"\x00\xff") == b"\x00\xff"


def test_known_values_are_stable() -> None:
    # pinned: a change of the hash would silently misplace every checkpointed key
    assert [key_group_for_key(k, 128) for k in ("a", "b", "user-42", 0, 1)] == [
        zlib.crc32(b"a") % 128,
        zlib.crc32(b"b") % 128,
        zlib.crc32(b"user-42") % 128,
        zlib.crc32(b"0") % 128,
        zlib.crc32(b"1") % 128,
    ]
    assert zlib.crc32(b"a") % 128 == 67


def test_unsupported_keys_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        key_bytes(True)
    with pytest.raises(InvalidArgument):
        key_bytes(1.5)


def test_ranges_of_seed_004_example() -> None:
    # 10 key groups, parallelism 3 -> 4 (the blog's Figure 3B)
    assert [r.as_tuple() for r in all_ranges(3, 10)] == [(0, 3), (4, 6), (7, 9)]
    assert [r.as_tuple() for r in all_ranges(4, 10)] == [(0, 2), (3, 4), (5, 7), (8, 9)]


@given(
    max_p=st.integers(min_value=1, max_value=4096),
    data=st.data(),
)
def test_ranges_partition_and_agree_with_the_operator_index(
    max_p: int, data: st.DataObject
) -> None:
    p = data.draw(st.integers(min_value=1, max_value=max_p))
    ranges = all_ranges(p, max_p)
    # contiguous, non-empty, covering [0, max_p) in order
    assert ranges[0].first == 0 and ranges[-1].last == max_p - 1
    for a, b in itertools.pairwise(ranges):
        assert b.first == a.last + 1
    kg = data.draw(st.integers(min_value=0, max_value=max_p - 1))
    i = operator_index_for_key_group(kg, p, max_p)
    assert kg in ranges[i]
    # range sizes differ by at most one
    sizes = {len(r) for r in ranges}
    assert max(sizes) - min(sizes) <= 1


def test_bad_parallelism_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        check_parallelism(0, 128)
    with pytest.raises(ConfigError):
        check_parallelism(129, 128)
    with pytest.raises(ConfigError):
        check_parallelism(1, 1 << 16)
    with pytest.raises(InvalidArgument):
        key_group_range_for_operator(3, 3, 128)
    with pytest.raises(InvalidArgument):
        operator_index_for_key_group(128, 2, 128)


def test_range_helpers() -> None:
    r = KeyGroupRange(4, 9)
    assert len(r) == 6 and next(iter(r)) == 4 and 9 in r and 10 not in r
    assert r.intersection(KeyGroupRange(8, 20)) == KeyGroupRange(8, 9)
    assert r.intersection(KeyGroupRange(10, 20)) is None
    with pytest.raises(InvalidArgument):
        KeyGroupRange(3, 2)


def test_sql_expressions_quote_the_column() -> None:
    assert key_group_sql("user", 128) == (
        "pmod(crc32(cast(cast(`user` AS STRING) AS BINARY)), 128)"
    )
    assert key_group_sql("we`ird", 8).count("``") == 1
    assert operator_index_sql("kg", 3, 128) == "CAST((`kg` * 3) DIV 128 AS INT)"
