"""The store's bulk paths (Arrow) against its per-key paths: same reads, same stores."""

from __future__ import annotations

import tempfile
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstl_client.core.errors import InvalidArgument, KeyGroupOutOfRange
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state import bulk
from dstl_client.state.bulk import read_rows, write_rows
from dstl_client.state.packed_rows import MAX_KEY_BYTES
from dstl_client.state.store import LocalKeyedStore, read_all_rows

RANGE = KeyGroupRange(2, 9)

Row = tuple[int, bytes, bytes | None]

# a small key space, so that reads and writes collide with the stored rows
kgs = st.integers(RANGE.first, RANGE.last)
row_keys = st.binary(min_size=0, max_size=3)
values = st.binary(min_size=0, max_size=6)
addresses = st.tuples(kgs, row_keys)
changes = st.lists(st.tuples(kgs, row_keys, st.none() | values), max_size=40)
chunk_rows = st.integers(1, 9)
BOUNDED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _store(directory: str | Path) -> LocalKeyedStore:
    return LocalKeyedStore(Path(directory) / "s", RANGE)


def _seed(store: LocalKeyedStore, main: list[Row], delta: list[Row]) -> None:
    """Main rows, merged; then a pending batch written the per-key way."""
    store.write_main(main)
    store.commit()
    store.write_delta(delta)
    store.set_meta(delta_version=1, delta_attempt="a")
    store.commit()


def _keys(addrs: list[tuple[int, bytes]]) -> pa.Table:
    return pa.table(
        {"kg": pa.array([a for a, _ in addrs], pa.int64()), "k": [b for _, b in addrs]},
        schema=pa.schema([("kg", pa.int64()), ("k", pa.binary())]),
    )


def _rows(rows: list[Row]) -> pa.Table:
    return pa.table(
        {
            "kg": pa.array([r[0] for r in rows], pa.int32()),
            "k": pa.array([r[1] for r in rows], pa.binary()),
            "v": pa.array([r[2] for r in rows], pa.binary()),
        }
    )


def _delta(store: LocalKeyedStore) -> list[tuple[int, bytes, bytes | None, str]]:
    return list(store._db.execute("SELECT kg, k, v, typeof(k) FROM delta ORDER BY kg, k"))


@BOUNDED
@given(
    main=changes,
    delta=changes,
    asked=st.lists(addresses, max_size=30),
    with_delta=st.booleans(),
    chunk=chunk_rows,
)
def test_a_bulk_read_is_the_per_key_read(
    main: list[Row], delta: list[Row], asked: list[tuple[int, bytes]], with_delta: bool, chunk: int
) -> None:
    # ask for stored keys too (kv rows, delta overrides and deletes), duplicates included
    asked = asked + [(kg, k) for kg, k, _ in main[::2] + delta[::2]]
    with tempfile.TemporaryDirectory() as d, _store(d) as store:
        _seed(store, [r for r in main if r[2] is not None], delta)
        got = read_rows(store, _keys(asked), with_delta=with_delta, chunk_rows=chunk)
        assert got.schema == bulk.ROWS_SCHEMA
        assert got.column("kg").to_pylist() == [kg for kg, _ in asked]
        assert got.column("k").to_pylist() == [k for _, k in asked]
        assert got.column("v").to_pylist() == [store.get(kg, k, with_delta) for kg, k in asked]


@BOUNDED
@given(main=changes, batch=changes, merge=st.booleans(), chunk=chunk_rows)
def test_a_bulk_write_makes_the_store_the_per_key_write_makes(
    main: list[Row], batch: list[Row], merge: bool, chunk: int
) -> None:
    stored = [r for r in main if r[2] is not None]
    with (
        tempfile.TemporaryDirectory() as d1,
        tempfile.TemporaryDirectory() as d2,
        _store(d1) as per_key,
        _store(d2) as in_bulk,
    ):
        _seed(per_key, stored, batch)
        _seed(in_bulk, stored, [])
        touched = write_rows(in_bulk, _rows(batch), chunk_rows=chunk)
        in_bulk.commit()
        assert touched == sorted({kg for kg, _, _ in batch})
        assert _delta(in_bulk) == _delta(per_key)
        assert in_bulk.count_live_rows() == per_key.count_live_rows()
        for store in (per_key, in_bulk):
            store.merge_delta() if merge else store.drop_delta()
        assert read_all_rows(in_bulk) == read_all_rows(per_key)
        assert in_bulk.changed_key_groups() == per_key.changed_key_groups()
        assert in_bulk.main_version == per_key.main_version


def test_reads_see_the_writes_of_the_open_batch(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        _seed(store, [(2, b"a", b"1"), (3, b"b", b"2")], [])
        write_rows(store, _rows([(2, b"a", None), (3, b"b", b"3"), (4, b"c", b"")]))
        keys = _keys([(2, b"a"), (3, b"b"), (4, b"c"), (5, b"d")])
        assert read_rows(store, keys).column("v").to_pylist() == [None, b"3", b"", None]
        assert read_rows(store, keys, with_delta=False).column("v").to_pylist() == [
            b"1",
            b"2",
            None,
            None,
        ]
        store.rollback()
        assert read_rows(store, keys).column("v").to_pylist() == [b"1", b"2", None, None]


def test_empty_keys_and_values_stay_blobs(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        # a chunk whose keys and values are all empty packs zero bytes of each
        write_rows(store, _rows([(2, b"", b""), (3, b"", b"")]), chunk_rows=1)
        assert _delta(store) == [(2, b"", b"", "blob"), (3, b"", b"", "blob")]
        assert read_rows(store, _keys([(2, b""), (3, b"")])).column("v").to_pylist() == [b"", b""]


def test_empty_input(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        assert read_rows(store, _keys([])).equals(bulk.ROWS_SCHEMA.empty_table())
        assert write_rows(store, _rows([])) == []
        store.commit()
        assert _delta(store) == []


def test_chunks_are_bounded_in_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "_CHUNK_BYTES", 10)
    rows: list[Row] = [(2, bytes([i]) * 4, bytes([i]) * (i % 12)) for i in range(30)]
    assert bulk._chunks(_rows(rows).column("k").chunk(0), None, 100)[:2] == [(0, 2), (2, 4)]
    # a row over the budget is a chunk of its own
    sizes = bulk._chunks(_rows(rows).column("k").chunk(0), _rows(rows).column("v").chunk(0), 100)
    assert sizes[0][0] == 0 and sizes[-1][1] == 30
    assert all(end > start for start, end in sizes)
    assert all(a[1] == b[0] for a, b in pairwise(sizes))
    with _store(tmp_path) as store:
        write_rows(store, _rows(rows))
        keys = _keys([(kg, k) for kg, k, _ in rows])
        assert read_rows(store, keys).column("v").to_pylist() == [v for _, _, v in rows]


def test_column_types(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        table = pa.table(
            {
                "kg": pa.chunked_array([pa.array([2], pa.int16()), pa.array([3], pa.int16())]),
                "k": pa.chunked_array([pa.array([b"x"], pa.large_binary())] * 2),
                "v": pa.array([b"1", None], pa.large_binary()),
            }
        )
        assert write_rows(store, table) == [2, 3]
        assert read_rows(store, table.select(["kg", "k"])).column("v").to_pylist() == [b"1", None]


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (pa.table({"kg": [1], "k": [b"a"], "v": [b""]}), KeyGroupOutOfRange),
        (pa.table({"kg": [10], "k": [b"a"], "v": [b""]}), KeyGroupOutOfRange),
        (pa.table({"kg": [2, None], "k": [b"a", b"b"], "v": [b"", b""]}), InvalidArgument),
        (pa.table({"kg": [2], "k": pa.array([None], pa.binary()), "v": [b""]}), InvalidArgument),
        (pa.table({"kg": [2], "k": ["a"], "v": [b""]}), InvalidArgument),
        (pa.table({"kg": [2.0], "k": [b"a"], "v": [b""]}), InvalidArgument),
        (pa.table({"k": [b"a"], "v": [b""]}), InvalidArgument),
        (pa.table({"kg": [2], "k": [b"a"]}), InvalidArgument),
        (pa.table({"kg": [2], "k": [b"a"], "v": ["text"]}), InvalidArgument),
        # the packed format addresses keys below 16 MiB
        (pa.table({"kg": [2], "k": [bytes(MAX_KEY_BYTES)], "v": [b""]}), InvalidArgument),
    ],
)
def test_bad_input_is_refused(tmp_path: Path, table: pa.Table, error: type[Exception]) -> None:
    with _store(tmp_path) as store:
        with pytest.raises(error):
            write_rows(store, table)
        if "v" in table.column_names and error is KeyGroupOutOfRange:
            with pytest.raises(error):
                read_rows(store, table.select(["kg", "k"]))
        store.commit()
        assert _delta(store) == []
