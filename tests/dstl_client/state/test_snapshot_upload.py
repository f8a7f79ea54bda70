"""Snapshot upload: packed PUT runs give the part the per-row path gave."""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client.client import REQUEST_MARGIN_BYTES, ChangelogClient
from dstl_client.core.errors import KeyGroupOutOfRange
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state import snapshot_upload
from dstl_client.state.changes import encode_put, pack_puts
from dstl_client.state.snapshot_upload import upload_snapshot
from dstl_client.state.store import LocalKeyedStore
from dstl_server.testing import ServerProcess

KiB = 1 << 10

_rows = st.lists(
    st.tuples(
        st.one_of(st.binary(max_size=20), st.binary(min_size=120, max_size=300)),
        st.binary(max_size=50),
    ),
    max_size=40,
)


@given(_rows)
def test_pack_puts_is_encode_put_back_to_back(rows: list[tuple[bytes, bytes]]) -> None:
    sizes, payload = pack_puts(rows)
    changes = [encode_put(k, v) for k, v in rows]
    assert sizes.typecode == "I"
    assert list(sizes) == [len(c) for c in changes]
    assert payload == b"".join(changes)


def _store(path: Path, rows: dict[int, dict[bytes, bytes]]) -> LocalKeyedStore:
    store = LocalKeyedStore(path, KeyGroupRange(0, 15))
    store.write_main((kg, k, v) for kg, kv in rows.items() for k, v in kv.items())
    store.commit()
    return store


@settings(max_examples=20, deadline=None)
@given(st.dictionaries(st.integers(0, 15), st.dictionaries(st.binary(max_size=8), st.binary())))
def test_row_batches_are_the_rows_of_the_key_group(rows: dict[int, dict[bytes, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as d, _store(Path(d), rows) as store:
        reader = store.snapshot_reader()
        try:
            for kg in range(16):
                batches = list(reader.row_batches(kg, 3))
                assert all(0 < len(b) <= 3 for b in batches)
                flat = [row for b in batches for row in b]
                assert flat == list(reader.rows_of_key_group(kg))
                assert flat == sorted(rows.get(kg, {}).items())
        finally:
            reader.close()


def test_upload_puts_every_row_in_key_order_across_requests(
    sidecar: ServerProcess, transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 256 KiB message limit and few rows per read: runs are split between
    # requests, key groups span several runs, one key group has no rows
    monkeypatch.setattr(snapshot_upload, "READ_ROWS", 7)
    rows = {
        kg: {
            f"key-{i:04d}".encode() + bytes(kg % 3 * 100): bytes([kg, i % 256]) * (i % 5000)
            for i in range(0, 60 + 10 * kg, 1 + kg % 3)
        }
        for kg in range(16)
        if kg != 4
    }
    limit = 256 * KiB
    with (
        ChangelogClient(
            sidecar.address,
            batch_bytes=100 * KiB,
            max_message_bytes=limit + REQUEST_MARGIN_BYTES,
            transport=transport,
        ) as client,
        _store(tmp_path / "s", rows) as store,
    ):
        reader = store.snapshot_reader()
        writer = client.create_writer(job_id="snap", operator_id="op", key_group_range=(0, 15))
        try:
            done = upload_snapshot(reader, writer, list(range(16)), 30)
        finally:
            reader.close()
        assert done.cleared == (4,)
        assert done.uploaded == tuple(kg for kg in range(16) if kg != 4)
        assert done.part is not None
        got: dict[int, list[bytes]] = {}
        for kg, _sqn, data in client.read_changes(done.part):
            got.setdefault(kg, []).append(data)
        want = {kg: [encode_put(k, v) for k, v in sorted(kv.items())] for kg, kv in rows.items()}
        assert got == want
        assert writer.failed is None
        writer.close()


def test_upload_of_empty_key_groups_persists_nothing(
    client: ChangelogClient, tmp_path: Path
) -> None:
    with _store(tmp_path / "s", {}) as store:
        reader = store.snapshot_reader()
        writer = client.create_writer(job_id="snap", operator_id="op", key_group_range=(0, 15))
        done = upload_snapshot(reader, writer, [1, 2], 10)
        reader.close()
        writer.close()
    assert done == snapshot_upload.UploadedSnapshot(None, (), (1, 2))


def _rows_of(kgs: range) -> dict[int, dict[bytes, bytes]]:
    return {kg: {f"k{i:03d}".encode(): bytes([kg]) * i for i in range(40)} for kg in kgs}


@pytest.mark.parametrize("read_ahead", [0, 1, 3])
def test_read_ahead_gives_the_same_part(
    client: ChangelogClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_ahead: int
) -> None:
    monkeypatch.setattr(snapshot_upload, "READ_ROWS", 3)  # many batches per key group
    rows = _rows_of(range(0, 16, 2))
    with _store(tmp_path / "s", rows) as store:
        reader = store.snapshot_reader()
        writer = client.create_writer(job_id="snap", operator_id="op", key_group_range=(0, 15))
        try:
            done = upload_snapshot(reader, writer, list(range(16)), 30, read_ahead=read_ahead)
        finally:
            reader.close()
            writer.close()
    assert done.uploaded == tuple(range(0, 16, 2))
    assert done.cleared == tuple(range(1, 16, 2))
    assert done.part is not None
    got: dict[int, list[bytes]] = {}
    for kg, _sqn, data in client.read_changes(done.part):
        got.setdefault(kg, []).append(data)
    assert got == {kg: [encode_put(k, v) for k, v in sorted(kv.items())] for kg, kv in rows.items()}


def _reading_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dstl-snapshot-read"]


def test_a_failed_append_stops_the_read_ahead(client: ChangelogClient, tmp_path: Path) -> None:
    """The appends fail at key group 8 (outside the writer's range) while the reading
    thread is ahead, blocked on a full queue: it stops, and nothing reads any more."""
    with _store(tmp_path / "s", _rows_of(range(16))) as store:
        reader = store.snapshot_reader()
        writer = client.create_writer(job_id="snap", operator_id="op", key_group_range=(0, 7))
        try:
            with pytest.raises(KeyGroupOutOfRange):
                upload_snapshot(reader, writer, list(range(16)), 30, read_ahead=1)
            assert not _reading_threads()
        finally:
            reader.close()
            writer.close()


def test_an_error_reading_the_snapshot_reaches_the_caller(
    client: ChangelogClient, tmp_path: Path
) -> None:
    with _store(tmp_path / "s", _rows_of(range(4))) as store:
        reader = store.snapshot_reader()
        reader.close()  # every read fails
        writer = client.create_writer(job_id="snap", operator_id="op", key_group_range=(0, 15))
        with pytest.raises(sqlite3.ProgrammingError):
            upload_snapshot(reader, writer, [0, 1], 30)
        assert not _reading_threads()
        writer.close()
