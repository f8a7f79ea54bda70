"""Restore: chunked, in-memory tail replay gives what a change-by-change replay gives."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.core.errors import CorruptObject
from dstl_client.core.format import ChangesetView, split_changes
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state import restore as restore_mod
from dstl_client.state.backend import KeyedStateBackend
from dstl_client.state.changes import (
    OP_PUT,
    decode_change,
    encode_delete,
    encode_delete_prefix,
    encode_list_append,
    encode_put,
)
from dstl_client.state.restore import restore_range
from dstl_client.state.restore_rows import KgRows as _KgRows
from dstl_client.state.restore_rows import KgTail as _KgTail
from dstl_client.state.restore_rows import decode_part_rows
from dstl_client.state.store import LocalKeyedStore, read_all_rows
from dstl_server.testing import ServerProcess
from tests.dstl_client.state._jobs import (
    MAX_P,
    decode_rows,
    make_batches,
    make_coordinator,
    reference,
    runner,
)

BATCHES = make_batches(8, rows=400, keys=80, seed=11)


def _view(changes: list[bytes], kg: int = 0) -> ChangesetView:
    sizes = struct.pack(f"<{len(changes)}I", *(len(c) for c in changes))
    return ChangesetView(kg, 1, len(changes), sizes, b"".join(changes))


def _replay_one_by_one(
    store: LocalKeyedStore, record: CheckpointRecord, client: ChangelogClient
) -> dict[tuple[int, bytes], bytes]:
    """The straightforward restore: part rows into the store, then the backend's replay."""
    store.reset()
    rng = store.kg_range
    per_kg = record.mat_per_kg()
    for pid, handle in record.parts.items():
        kgs = [kg for kg in rng if per_kg[kg][0] == pid]
        rows = []
        for view in client.read_changesets(handle, kgs):
            for data in split_changes(view.count, view.sizes, view.payload):
                op, k, v = decode_change(data)
                assert op == OP_PUT
                rows.append((view.key_group, k, v))
        store.write_main(rows)
    backend = KeyedStateBackend(store, record.max_parallelism, target="main")
    for seg in sorted(record.segments, key=lambda s: (s.batch, s.first)):
        kgs = [kg for kg in rng if seg.first <= kg <= seg.last and per_kg[kg][1] < seg.batch]
        if kgs:
            for kg, _sqn, data in client.read_changes(seg.handle, kgs):
                backend.apply_change(kg, data)
    backend.flush()
    store.commit()
    return read_all_rows(store)


@pytest.mark.parametrize(
    ("chunk_bytes", "step_bytes"),
    [(1, 1), (8192, 1024), (restore_mod.CHUNK_BYTES, restore_mod.STEP_BYTES)],
)
def test_restore_equals_a_change_by_change_replay(
    tmp_path: Path,
    sidecar: ServerProcess,
    client: ChangelogClient,
    monkeypatch: pytest.MonkeyPatch,
    chunk_bytes: int,
    step_bytes: int,
) -> None:
    # a materialization after batch 2, then a tail of 5 batches with map clears
    # (DELETE_PREFIX), list appends and rewrites of the list
    coord = make_coordinator(tmp_path, sidecar.address, job_id=f"restore-{chunk_bytes}")
    run = runner(coord, 2, client)
    for b, rows in enumerate(BATCHES):
        coord.set_materialize_interval(0 if b == 3 else 3600)
        assert run.run_batch(b, rows) is not None
    record = coord.latest
    assert record is not None and record.parts and len(record.segments) >= 4
    monkeypatch.setattr(restore_mod, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(restore_mod, "STEP_BYTES", step_bytes)
    full = KeyGroupRange(0, MAX_P - 1)
    with LocalKeyedStore(tmp_path / "new", full) as store:
        counts = restore_range(store, record, client)
        got = read_all_rows(store)
        assert store.main_version == (record.batch_id, "restored")
        changed = store.changed_key_groups()
    with LocalKeyedStore(tmp_path / "old", full) as store:
        want = _replay_one_by_one(store, record, client)
    assert got == want
    assert decode_rows(got) == reference(BATCHES)
    assert counts.rows > 0 and counts.replayed > 0
    assert counts.bytes > 0
    assert changed and max(changed.values()) == record.batch_id
    # a sub-range (another parallelism) restores its key groups only
    part = KeyGroupRange(5, 20)
    with LocalKeyedStore(tmp_path / "part", part) as store:
        restore_range(store, record, client)
        assert read_all_rows(store) == {kk: v for kk, v in want.items() if kk[0] in part}
    coord.close()


def test_tail_in_memory_matches_a_naive_model() -> None:
    rnd = random.Random(5)
    prefixes = [b"\x01m\x01a\x00", b"\x01m\x01b\x00", b"\x01l\x01a"]
    model: dict[bytes, bytes] = {}
    rows = _KgRows([])
    for step in range(3000):
        batch: list[bytes] = []
        for _ in range(rnd.randrange(1, 20)):
            p = rnd.choice(prefixes)
            k = p + bytes([rnd.randrange(6)]) * rnd.randrange(1, 3)
            op = rnd.randrange(10)
            if op < 4:
                v = bytes([step % 256]) * rnd.randrange(0, 200)
                batch.append(encode_put(k, v))
                model[k] = v
            elif op < 6:
                batch.append(encode_delete(k))
                model.pop(k, None)
            elif op < 8:
                e = bytes([step % 7])
                batch.append(encode_list_append(k, e))
                model[k] = model.get(k, b"") + e
            else:
                batch.append(encode_delete_prefix(p))
                for key in [key for key in model if key.startswith(p)]:
                    del model[key]
        rows.apply(_view(batch))
        if step % 500 == 0:
            assert rows.rows == model
    assert rows.rows == model
    assert rows.index is not None and rows.index == sorted(model)


def test_long_keys_and_corrupt_payloads() -> None:
    long_key = b"k" * 300  # a two-byte varint: the general decoder
    rows = _KgRows([(b"a", b"1")])
    rows.apply(_view([encode_put(long_key, b"v"), encode_put(b"a", b"2")]))
    assert rows.rows == {b"a": b"2", long_key: b"v"}
    with pytest.raises(CorruptObject):
        rows.apply(_view([b"\x01\x05ab"]))  # key runs past the change
    bad = _view([encode_put(b"a", b"1")])
    with pytest.raises(CorruptObject):
        rows.apply(ChangesetView(0, 1, 1, bad.sizes, bad.payload + b"x"))
    with pytest.raises(CorruptObject):
        decode_part_rows(0, _view([encode_delete(b"a")]), "p")
    assert decode_part_rows(0, _view([encode_put(long_key, b"v")]), "p") == [(long_key, b"v")]


_keys = st.sampled_from(
    [b"\x01m\x01a\x00" + bytes([i]) for i in range(4)]
    + [b"\x01l\x01a", b"\x01v\x01b", b"k" * 200, b"k" * 200 + b"\x00"]
)
_change = st.one_of(
    st.builds(encode_put, _keys, st.binary(max_size=6)),
    st.builds(encode_put, _keys, st.binary(max_size=6)),  # PUTs are the usual case
    st.builds(encode_delete, _keys),
    st.builds(encode_list_append, _keys, st.binary(min_size=1, max_size=3)),
    st.builds(encode_delete_prefix, st.sampled_from([b"\x01m\x01a\x00", b"k" * 200, b"\x01"])),
)


@pytest.mark.slow
@settings(max_examples=300)
@given(
    st.dictionaries(_keys, st.binary(max_size=4)),
    st.lists(st.lists(_change, max_size=8), max_size=6),
)
def test_folded_tail_rebuilds_what_applying_every_change_gives(
    part: dict[bytes, bytes], views: list[list[bytes]]
) -> None:
    part_rows = sorted(part.items())
    want = _KgRows(part_rows)
    tail = _KgTail()
    for changes in views:
        want.apply(_view(changes))
        tail.add(_view(changes))
    assert tail.rebuild(part_rows) == sorted(want.rows.items())


def test_a_tail_of_puts_keeps_only_the_last_value_of_each_row() -> None:
    tail = _KgTail()
    tail.add(_view([encode_put(b"a", b"1"), encode_put(b"b", b"1")]))
    tail.add(_view([encode_put(b"a", b"2")]))
    assert tail.latest == {b"a": b"2", b"b": b"1"} and not tail.rest
    assert tail.rebuild([(b"a", b"0"), (b"c", b"0")]) == [(b"a", b"2"), (b"b", b"1"), (b"c", b"0")]
    # from the first other change on, the rest is kept and applied in order
    tail.add(_view([encode_put(b"c", b"3"), encode_delete(b"a"), encode_put(b"d", b"4")]))
    tail.add(_view([encode_put(b"a", b"5")]))
    assert tail.latest == {b"a": b"2", b"b": b"1", b"c": b"3"}
    assert [(first, pos) for _view_, first, pos in tail.rest] == [(1, 4), (0, 0)]
    assert tail.rebuild([(b"e", b"0")]) == [
        (b"a", b"5"),
        (b"b", b"1"),
        (b"c", b"3"),
        (b"d", b"4"),
        (b"e", b"0"),
    ]
    bad = _view([encode_put(b"a", b"1")])
    with pytest.raises(CorruptObject):
        _KgTail().add(ChangesetView(0, 1, 1, bad.sizes, bad.payload + b"x"))
    with pytest.raises(CorruptObject):
        _KgTail().add(_view([b"\x01\x05ab"]))  # key runs past the change
