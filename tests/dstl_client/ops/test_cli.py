"""The ``dstl`` CLI against a real job's checkpoints (LocalRunner, a real sidecar process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client.batch.local import checkpoint_rows
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.rest import CheckpointConfigServer
from dstl_client.coordinator.storage import CheckpointStorage
from dstl_client.core.version import package_version
from dstl_client.keygroups import key_group_for_key
from dstl_server.testing import ServerProcess
from tests.dstl_client.ops._helpers import BATCHES, Job, dstl
from tests.dstl_client.state._jobs import decode_rows, reference

SERIALIZERS = [
    "--serializer",
    "count=int64",
    "--serializer",
    "sum=reducing:int64",
    "--serializer",
    "pages=map:str:int64",
    "--serializer",
    "recent=list:int64",
]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, sidecar: ServerProcess) -> Iterator[Job]:
    """Six batches of the state tests' job (every kind of state), 3 retained, read only."""
    j = Job(tmp_path_factory.mktemp("ops-job"), sidecar.address, "ops-read")
    with ChangelogClient(sidecar.address) as client:
        client.wait_ready()
        j.run(client, range(6))
    yield j


def records(job: Job, prefix: str = "checkpoints/") -> CheckpointStorage:
    return CheckpointStorage(job.checkpoint_dir / "dstl" / prefix)


def stored(sidecar: ServerProcess, job_id: str) -> set[str]:
    root = Path(sidecar.storage.removeprefix("file://"))
    return {p.relative_to(root).as_posix() for p in (root / job_id).rglob("*.dstl")}


# ------------------------------------------------------------ checkpoints


def test_checkpoints_list_shows_each_retained_checkpoint_with_its_sizes(job: Job) -> None:
    r = dstl("checkpoints", "list", *job.where())
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == [
        "OPERATOR",
        "BATCH",
        "STATUS",
        "CREATED",
        "SIZE",
        "OBJECTS",
        "MATERIALIZED",
        "CHANGELOG",
    ]
    assert [line.split()[1] for line in lines[1:]] == ["3", "4", "5"]
    doc = dstl("checkpoints", "list", "--json", *job.where()).json()
    assert doc["job_id"] == "ops-read"
    assert [c["batch_id"] for c in doc["checkpoints"]] == [3, 4, 5]
    for c in doc["checkpoints"]:
        rec = records(job).load(c["batch_id"])
        assert c["objects"] == len(rec.object_keys())
        assert c["materialized_bytes"] == sum(h.stored_bytes for h in rec.parts.values())
        assert c["materialized_bytes"] > 0  # batch 2 materialized
        assert c["changelog_bytes"] == sum(s.handle.stored_bytes for s in rec.segments)
        assert c["size_bytes"] == c["materialized_bytes"] + c["changelog_bytes"]
        assert c["status"] == "retained" and c["operator_id"] == "keyed"


def test_checkpoints_show_and_a_batch_that_is_not_retained(job: Job) -> None:
    r = dstl("checkpoints", "show", "4", *job.where())
    assert r.code == 0, r.err
    assert "batch:" in r.out and "materialized:" in r.out and "changelog:" in r.out
    rec = records(job).load(4)
    for key in rec.object_keys():
        assert key in r.out
    doc = dstl("checkpoints", "show", "--json", *job.where()).json()  # the latest
    assert doc["batch_id"] == 5 and doc["source_progress"] == {"batch": 5}
    assert doc["object_keys"] == sorted(records(job).load(5).object_keys())

    r = dstl("checkpoints", "show", "1", *job.where())
    assert r.code == 2 and r.out == ""
    assert r.err.startswith("dstl: error: no retained checkpoint of batch 1")
    assert "3, 4, 5" in r.err and len(r.err.splitlines()) == 1


# ------------------------------------------------------------------ state


def test_state_get_decodes_with_the_serializers_given(job: Job) -> None:
    want = reference(BATCHES[:6])
    key = "key-3"
    r = dstl("state", "get", "--key", key, "--json", *SERIALIZERS, *job.where())
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["batch_id"] == 5 and doc["key_group"] == key_group_for_key(key, 32)
    got: dict[str, object] = {"pages": {}}
    for s in doc["states"]:
        if s["state"] == "pages":
            got["pages"][s["user_key"]] = s["value"]  # type: ignore[index]
        else:
            got[s["state"]] = s["value"]
    assert got == want[key]

    table = dstl("state", "get", "--key", key, "--batch", "3", *SERIALIZERS, *job.where())
    assert table.code == 0
    assert table.out.splitlines()[0].split() == ["STATE", "KIND", "USER", "KEY", "VALUE"]
    count_line = next(line for line in table.out.splitlines() if line.startswith("count"))
    assert count_line.split()[-1] == str(reference(BATCHES[:4])[key]["count"])

    raw = dstl("state", "get", "--key", key, *job.where())  # no serializers: raw bytes
    assert raw.code == 0 and "0x" in raw.out and "--serializer" in raw.out
    none = dstl("state", "get", "--key", "no-such-key", *job.where())
    assert none.code == 0 and "no state of key 'no-such-key'" in none.out
    bad = dstl("state", "get", "--key", key, "--serializer", "count=int32", *job.where())
    assert bad.code == 2 and "unknown serializer int32" in bad.err


# ---------------------------------------------------------------- objects


def test_objects_inspect_through_the_sidecar_and_from_the_store(
    job: Job, objects_dir: Path, tmp_path: Path
) -> None:
    rec = records(job).load(5)
    part = next(iter(rec.parts.values()))
    key = part.entries[0].object_key
    r = dstl("objects", "inspect", key, *job.where())
    assert r.code == 0, r.err
    assert "verified" in r.out and "keyed@5: part" in r.out
    via_sidecar = dstl("objects", "inspect", key, "--json", *job.where()).json()
    assert via_sidecar["read"] == "sidecar" and via_sidecar["checksums_verified"]
    section = next(s for s in via_sidecar["sections"] if s["log_id"] == part.log_id)
    assert section["offset"] == part.entries[0].offset
    assert section["key_groups"]  # the materialized key groups, with their changes

    storage = f"file://{objects_dir}"
    whole = dstl("objects", "inspect", key, "--json", "--storage", storage, *job.where()).json()
    assert whole["read"] == "store" and whole["size_bytes"] == (objects_dir / key).stat().st_size
    # every section of the file, the named ones agreeing with the sidecar's reading
    same = next(s for s in whole["sections"] if s["log_id"] == part.log_id)
    assert same == section

    # a damaged copy: one flipped byte in the last key-group block of a section
    damaged = tmp_path / "store"
    (damaged / key).parent.mkdir(parents=True)
    data = bytearray((objects_dir / key).read_bytes())
    data[section["offset"] + section["length"] - 6] ^= 0xFF
    (damaged / key).write_bytes(bytes(data))
    bad = dstl("objects", "inspect", key, "--storage", f"file://{damaged}", *job.where())
    assert bad.code == 1 and "checksum mismatch" in bad.err and bad.out == ""

    missing = dstl("objects", "inspect", f"{job.job_id}/00/nope.dstl", *job.where())
    assert missing.code == 2 and "no record of job ops-read names object" in missing.err
    other_job = dstl("objects", "inspect", "other/00/x.dstl", "--storage", storage, *job.where())
    assert other_job.code == 2


# --------------------------------------------------------------------- gc


def test_gc_dry_run_lists_unreferenced_objects_and_gc_discards_them(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    job = Job(tmp_path, sidecar.address, "ops-gc")
    job.run(client, range(4))
    # an orphan: uploaded by a writer whose checkpoint was never recorded
    w = client.create_writer(job_id="ops-gc", operator_id="keyed", key_group_range=(0, 31))
    w.append(key_group=3, data=b"orphan")
    orphan = w.persist_durably(after=0).result(timeout=10).entries[0].object_key
    w.close()
    referenced = set().union(*(records(job).load(b).object_keys() for b in (1, 2, 3)))

    dry = dstl("gc", "--dry-run", "--json", *job.where())
    assert dry.code == 0, dry.err
    doc = dry.json()
    assert {o["key"] for o in doc["unreferenced"]} == stored(sidecar, "ops-gc") - referenced
    assert orphan in {o["key"] for o in doc["unreferenced"]}
    assert not any(o["would_delete"] for o in doc["unreferenced"])  # younger than 600 s
    table = dstl("gc", "--dry-run", "--grace-s", "0", *job.where())
    assert f"{orphan}" in table.out and "delete" in table.out and "dry run" in table.out
    assert orphan in stored(sidecar, "ops-gc")  # a dry run deletes nothing

    r = dstl("gc", "--grace-s", "0", *job.where())
    assert r.code == 0 and r.out.startswith("deleted ")
    after = stored(sidecar, "ops-gc")
    assert referenced <= after and orphan not in after
    want = reference(BATCHES[:4])
    assert decode_rows(checkpoint_rows(records(job).load(3), client)) == want


# ---------------------------------------------------------------- restore


def test_restore_moves_newer_records_aside_until_the_new_run_supersedes_them(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    job = Job(tmp_path, sidecar.address, "ops-restore")
    job.run(client, range(6), materialize_at=(2, 5))
    old5 = records(job).load(5)
    r = dstl("checkpoints", "restore", "1", *job.where())
    assert r.code == 2 and "not a retained checkpoint" in r.err and "3, 4, 5" in r.err

    r = dstl("checkpoints", "restore", "3", *job.where())
    assert r.code == 0, r.err
    assert "restored to batch 3" in r.out and "4, 5" in r.out
    assert records(job).batch_ids() == [3]
    assert records(job, "checkpoints/superseded/").batch_ids() == [4, 5]
    listed = dstl("checkpoints", "list", "--all", "--json", *job.where()).json()["checkpoints"]
    assert [(c["batch_id"], c["status"]) for c in listed] == [
        (3, "retained"),
        (4, "superseded"),
        (5, "superseded"),
    ]

    # the new run: other input for batches 4 and 5 (a fixed deployment)
    fixed = [*BATCHES[:4], BATCHES[6], BATCHES[7]]
    job.run(client, range(4, 5), data=fixed, materialize_at=())
    assert records(job).batch_ids() == [3, 4]
    assert records(job, "checkpoints/superseded/").batch_ids() == [5]
    # the superseded record's objects are all still there (the new run's discards spared them)
    assert old5.object_keys() <= stored(sidecar, "ops-restore")
    assert decode_rows(checkpoint_rows(old5, client)) == reference(BATCHES[:6])
    job.run(client, range(5, 6), data=fixed, materialize_at=())
    assert records(job).batch_ids() == [3, 4, 5]
    assert records(job, "checkpoints/superseded/").batch_ids() == []
    # the results equal a run that stopped at 3 and went on with the fixed input
    assert decode_rows(checkpoint_rows(records(job).load(5), client)) == reference(fixed)
    # and what only the superseded records used is gone
    kept = set().union(*(records(job).load(b).object_keys() for b in (3, 4, 5)))
    assert not (old5.object_keys() - kept) & stored(sidecar, "ops-restore")


def test_restore_from_acts_once_per_batch(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    job = Job(tmp_path, sidecar.address, "ops-restore-from")
    job.run(client, range(5))
    coord = job.coordinator(client=client, restore_from=3)
    try:
        assert coord.latest is not None and coord.latest.batch_id == 3
        assert coord.restored is not None and coord.restored.superseded == (4,)
    finally:
        coord.close()
    job.run(client, range(4, 6), restore_from=3)  # the same option again: no second roll back
    assert records(job).batch_ids() == [3, 4, 5]
    assert decode_rows(checkpoint_rows(records(job).load(5), client)) == reference(BATCHES[:6])
    bad = job.coordinator
    with pytest.raises(Exception, match="not a retained checkpoint"):
        bad(client=client, restore_from=1)


# ---------------------------------------------------------------- dispose


def test_dispose_needs_yes_and_removes_records_and_objects(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    job = Job(tmp_path, sidecar.address, "ops-dispose")
    job.run(client, range(3))
    (job.checkpoint_dir / "spark" / "offsets").mkdir(parents=True)  # as a Spark query leaves it
    r = dstl("checkpoints", "dispose", "--objects", *job.where())
    assert r.code == 2 and "run again with --yes" in r.err
    assert records(job).batch_ids() == [0, 1, 2] and stored(sidecar, "ops-dispose")

    before = stored(sidecar, "ops-dispose")
    r = dstl("checkpoints", "dispose", "--objects", "--yes", "--json", *job.where())
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["records"] == 3 and doc["objects"] > 0
    assert records(job).batch_ids() == []
    # (a losing hedged upload the sidecar deletes by itself may come and go meanwhile)
    assert not before & stored(sidecar, "ops-dispose")
    assert not (job.checkpoint_dir / "spark").exists()
    # a new start begins from nothing
    job.run(client, range(2))
    assert decode_rows(checkpoint_rows(records(job).load(1), client)) == reference(BATCHES[:2])


def test_cancel_with_delete_on_cancellation_disposes_of_the_operator(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    from dstl_client.batch.query import DstlQuery

    for retain_on_cancel in (True, False):
        job = Job(
            tmp_path / str(retain_on_cancel), sidecar.address, f"ops-cancel-{retain_on_cancel}"
        )
        job.run(client, range(3))
        coord = job.coordinator(client=client, retain_on_cancel=retain_on_cancel)
        used = set().union(*(records(job).load(b).object_keys() for b in (0, 1, 2)))
        DstlQuery(coord, None).stop(cancel=True)
        if retain_on_cancel:  # RETAIN_ON_CANCELLATION, the default
            assert records(job).batch_ids() == [0, 1, 2]
        else:  # DELETE_ON_CANCELLATION
            assert records(job).batch_ids() == []
            assert not used & stored(sidecar, job.job_id)


# ----------------------------------------------------------------- config


def test_config_takes_the_job_id_beside_the_checkpoint_dir_and_no_sidecar_flags(
    tmp_path: Path, sidecar: ServerProcess
) -> None:
    job = Job(tmp_path, sidecar.address, "ops-config")
    coord = job.coordinator(checkpoint_timeout_s=60)
    server = CheckpointConfigServer()  # loopback, no token: none is sent
    try:
        server.register(coord)
        url = ["--rest-url", f"http://127.0.0.1:{server.port}", "--job-id", "ops-config"]
        where = ["--checkpoint-dir", str(job.checkpoint_dir)]
        r = dstl("config", "set", "checkpointTimeout=90s", "--json", *url, *where)
        assert r.code == 0, r.err
        assert r.json()["checkpointTimeout"] == 90_000
        assert coord.config.checkpoint_timeout_s == 90
        # the sidecar's flags are not config's: named, refused
        r = dstl("config", "get", *url, "--address", sidecar.address)
        assert r.code == 2 and "unrecognized arguments: --address" in r.err
    finally:
        server.close()
        coord.close()


# ---------------------------------------------------- the console script


@pytest.mark.slow
def test_the_installed_console_script(job: Job) -> None:
    script = Path(sys.executable).parent / "dstl"
    if not script.exists():
        pytest.skip("the dstl console script is not installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if k not in ("DSTL_ADDRESS", "DSTL_TOKEN")}
    done = subprocess.run(
        [str(script), "checkpoints", "list", "--json", "--checkpoint-dir", str(job.checkpoint_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [c["batch_id"] for c in json.loads(done.stdout)["checkpoints"]] == [3, 4, 5]
    failed = subprocess.run(
        [str(script), "gc", "--dry-run", "--checkpoint-dir", str(job.checkpoint_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    # no sidecar address: one line, exit code 2, no traceback
    assert failed.returncode == 2
    assert failed.stderr.startswith("dstl: error: no sidecar address")
    assert len(failed.stderr.splitlines()) == 1 and "Traceback" not in failed.stderr
    usage = subprocess.run(
        [str(script), "checkpoints", "frobnicate"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    version = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, env=env, timeout=60
    )
    assert version.returncode == 0 and version.stdout == f"dstl {package_version()}\n"
