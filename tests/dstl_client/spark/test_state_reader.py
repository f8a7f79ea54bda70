"""The state reader without Spark: a real keyed job (LocalRunner) on a real sidecar, read back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.batch.local import checkpoint_rows
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.storage import CheckpointMissing, CheckpointStorage
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.keygroups import key_group_for_key
from dstl_client.spark import state_rows
from dstl_client.spark.state_reader import (
    StateRow,
    StateSpec,
    iter_state_rows,
    load_checkpoint,
    retained_checkpoints,
)
from dstl_client.state.changes import MAP_TAG, state_prefix
from dstl_client.state.serializers import INT64, STR
from dstl_server.testing import ServerProcess
from tests.dstl_client.state._jobs import MAX_P, make_batches, make_coordinator, reference, runner

BATCHES = make_batches(4, rows=150, keys=40, seed=11)
#: how job_fn's states are decoded
SERIALIZERS: dict[str, Any] = {
    "count": INT64,
    "sum": StateSpec.reducing_state(INT64),
    "pages": StateSpec.map_state(STR, INT64),
    "recent": StateSpec.list_state(INT64),
}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, sidecar: ServerProcess) -> Iterator[Path]:
    """Operator "keyed" ran every batch (2 retained), operator "other" the first two."""
    root = tmp_path_factory.mktemp("job")
    with ChangelogClient(sidecar.address) as client:
        client.wait_ready()
        # "keyed" never materializes (its state is all changelog); "other" every batch, so
        # its last record restores from materialized parts
        for operator, batches, interval in (
            ("keyed", BATCHES, 3600.0),
            ("other", BATCHES[:2], 0.0),
        ):
            coord = make_coordinator(
                root,
                sidecar.address,
                job_id="reader",
                operator_id=operator,
                interval=interval,
                client=client,
            )
            run = runner(coord, 2, client)
            for b, rows in enumerate(batches):
                assert run.run_batch(b, rows) is not None
            assert coord.latest is not None
            assert bool(coord.latest.parts) == (operator == "other")
            coord.close()
    yield root / "ckpt"


def as_reference(rows: Iterator[StateRow]) -> dict[str, dict[str, Any]]:
    """Decoded rows in the shape of :func:`reference`."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(r.key, {"count": 0, "sum": 0, "pages": {}, "recent": []})
        if r.state_kind == "map":
            s[r.state_name][r.user_key] = r.value
        else:
            s[r.state_name] = r.value
    return out


def test_the_latest_and_an_older_retained_checkpoint_decode_to_the_job_state(
    job: Path, client: ChangelogClient
) -> None:
    assert retained_checkpoints(checkpoint_dir=str(job)) == {"keyed": [2, 3], "other": [0, 1]}
    rows = list(iter_state_rows(checkpoint_dir=str(job), serializers=SERIALIZERS, client=client))
    assert as_reference(iter(rows)) == reference(BATCHES)
    assert {(r.state_name, r.state_kind) for r in rows} == {
        ("count", "value"),
        ("sum", "reducing"),
        ("pages", "map"),
        ("recent", "list"),
    }
    for r in rows:
        assert r.key_group == key_group_for_key(r.key, MAX_P)
        assert r.value_decoded and r.user_key_decoded == (r.state_kind == "map")
    # ordered by key group; map entries carry their user key, as text and bytes
    assert [r.key_group for r in rows] == sorted(r.key_group for r in rows)
    entry = next(r for r in rows if r.state_kind == "map")
    assert entry.user_key_bytes == STR.dumps(entry.user_key)
    assert entry.user_key_json == f'"{entry.user_key}"'
    assert entry.value_json == str(entry.value)
    recent = next(r for r in rows if r.state_kind == "list")
    assert recent.value_json == "[" + ",".join(map(str, recent.value)) + "]"

    older = iter_state_rows(
        checkpoint_dir=str(job), batch_id=2, serializers=SERIALIZERS, client=client
    )
    assert as_reference(older) == reference(BATCHES[:3])
    other = iter_state_rows(
        checkpoint_dir=str(job), operator_id="other", serializers=SERIALIZERS, client=client
    )
    assert as_reference(other) == reference(BATCHES[:2])


def test_without_serializers_rows_are_the_stored_bytes(
    job: Path, client: ChangelogClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # several scratch stores, one after the other (the bound on their disk use)
    monkeypatch.setattr(state_rows, "RESTORE_KEY_GROUPS", 5)
    rows = list(iter_state_rows(checkpoint_dir=str(job), client=client))
    storage = CheckpointStorage(job / "dstl" / "checkpoints")
    want = checkpoint_rows(storage.load(3), client)
    got = {}
    for r in rows:
        assert r.value == r.value_bytes
        assert not r.value_decoded and r.value_json is None and r.user_key_json is None
        assert r.state_kind == ("map" if r.state_name == "pages" else None)
        assert r.user_key == r.user_key_bytes and (r.user_key is None) == (r.state_kind != "map")
        k = state_prefix(r.state_name.encode(), r.key_bytes)
        if r.user_key_bytes is not None:
            k = k + MAP_TAG + r.user_key_bytes
        got[r.key_group, k] = r.value_bytes
    assert got == want and len(rows) == len(want)

    # a bare serializer decodes the value of a single row, or of every map entry
    bare = iter_state_rows(
        checkpoint_dir=str(job), serializers={"count": INT64, "pages": INT64}, client=client
    )
    pages: dict[tuple[str, bytes], int] = {}
    counts: dict[str, int] = {}
    for r in bare:
        if r.state_name == "count":
            assert r.state_kind == "value"
            counts[r.key] = r.value
        elif r.state_name == "pages":
            assert r.state_kind == "map" and not r.user_key_decoded and r.value_decoded
            assert r.user_key_bytes is not None
            pages[r.key, r.user_key_bytes] = r.value
    ref = reference(BATCHES)
    assert counts == {k: s["count"] for k, s in ref.items()}
    assert pages == {(k, p.encode()): n for k, s in ref.items() for p, n in s["pages"].items()}


def test_key_groups_select_a_subset(job: Path, client: ChangelogClient) -> None:
    everything = list(iter_state_rows(checkpoint_dir=str(job), client=client))
    some = {1, 2, 3, 17, 30}
    subset = list(iter_state_rows(checkpoint_dir=str(job), key_groups=some, client=client))
    assert subset == [r for r in everything if r.key_group in some]
    assert {r.key_group for r in subset} <= some and subset


def test_missing_checkpoints_name_what_there_is(
    job: Path, tmp_path: Path, client: ChangelogClient
) -> None:
    with pytest.raises(CheckpointMissing, match=r"batch 1 .*retained ones are batches 2, 3"):
        load_checkpoint(checkpoint_dir=str(job), batch_id=1)
    with pytest.raises(CheckpointMissing, match=r"operator 'nope'.*are 'keyed', 'other'"):
        iter_state_rows(checkpoint_dir=str(job), operator_id="nope", client=client)
    (tmp_path / "empty" / "dstl").mkdir(parents=True)
    with pytest.raises(CheckpointMissing, match="no checkpoint records at"):
        load_checkpoint(checkpoint_dir=str(tmp_path / "empty"))
    with pytest.raises(CheckpointMissing, match="no such directory"):
        load_checkpoint(metadata_url=str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()  # a reader creates nothing
    assert retained_checkpoints(checkpoint_dir=str(tmp_path / "nowhere")) == {}
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        load_checkpoint()


def test_wrong_serializers_and_key_groups_are_clear_errors(
    job: Path, client: ChangelogClient
) -> None:
    with pytest.raises(InvalidArgument, match=r"state 'pages' .* is a map entry, not a value"):
        list(
            iter_state_rows(
                checkpoint_dir=str(job),
                serializers={"pages": StateSpec.value_state(INT64)},
                client=client,
            )
        )
    with pytest.raises(InvalidArgument, match=r"state 'recent' .*cannot decode"):
        list(iter_state_rows(checkpoint_dir=str(job), serializers={"recent": INT64}, client=client))
    with pytest.raises(InvalidArgument, match="neither a Serializer"):
        iter_state_rows(checkpoint_dir=str(job), serializers={"x": 5}, client=client)  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument, match=r"outside \[0, 32\)"):
        iter_state_rows(checkpoint_dir=str(job), key_groups=[32], client=client)
    with pytest.raises(InvalidArgument, match="key serializer"):
        StateSpec("list", INT64, STR)
