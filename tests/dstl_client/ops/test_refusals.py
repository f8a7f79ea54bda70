"""What the operator commands and the driver refuse, and that a refusal changes nothing.

* ``dstl gc`` and the driver's orphan sweep delete nothing unless they read at
  least one checkpoint record *of that job* at the metadata location (a wrong
  ``--metadata-url`` once deleted every object of the job older than the grace).
* A refused ``dstl checkpoints restore`` writes no restore marker: the next plain
  start runs normally.
* Corrupt records and override files are one-line errors naming the file.

A real sidecar process (file:// storage), real records written by the coordinator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstl_client.batch.local import checkpoint_rows
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.storage import CheckpointStorage
from dstl_server.testing import ServerProcess
from tests.dstl_client.ops._helpers import BATCHES, Job, dstl
from tests.dstl_client.state._jobs import decode_rows, reference


def records(job: Job, prefix: str = "checkpoints/") -> CheckpointStorage:
    return CheckpointStorage(job.checkpoint_dir / "dstl" / prefix)


def stored(sidecar: ServerProcess, job_id: str) -> set[str]:
    root = Path(sidecar.storage.removeprefix("file://"))
    return {p.relative_to(root).as_posix() for p in (root / job_id).rglob("*.dstl")}


def referenced(job: Job) -> set[str]:
    r = records(job)
    return set().union(*(r.load(b).object_keys() for b in r.batch_ids()))


def one_line(err: str) -> str:
    """The CLI's stderr is one ``dstl: error:`` line, no traceback."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dstl: error: "), err
    return lines[0]


# ---------------------------------------------------------------------- gc


def test_gc_refuses_when_it_reads_no_record_of_the_job(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    job = Job(tmp_path / "a", sidecar.address, "refuse-gc")
    job.run(client, range(3))
    other = Job(tmp_path / "b", sidecar.address, "refuse-gc-other")
    other.run(client, range(2))
    keep = referenced(job)
    assert keep and keep <= stored(sidecar, job.job_id)
    missing = tmp_path / "no" / "such" / "dir"
    empty = tmp_path / "empty"
    empty.mkdir()
    wrong = {
        "the checkpoint dir instead of its dstl/ folder": str(job.checkpoint_dir),
        "a path that does not exist": str(missing),
        "an empty folder": str(empty),
        "another job's metadata": str(other.checkpoint_dir / "dstl"),
    }
    for what, url in wrong.items():
        for dry in ((), ("--dry-run",)):
            r = dstl(
                "gc",
                *dry,
                "--grace-s",
                "0",
                "--metadata-url",
                url,
                "--job-id",
                job.job_id,
                "--address",
                sidecar.address,
            )
            assert r.code == 2, (what, r)
            line = one_line(r.err)
            assert "no checkpoint record of job 'refuse-gc'" in line, line
            assert Path(url).as_uri() in line or url in line, line  # says where it looked
            assert keep <= stored(sidecar, job.job_id), what  # nothing referenced went
    assert not missing.exists()  # looking created nothing
    assert (
        "refuse-gc-other"
        in dstl(
            "gc",
            "--metadata-url",
            str(other.checkpoint_dir / "dstl"),
            "--job-id",
            job.job_id,
            "--address",
            sidecar.address,
        ).err
    )  # names the job whose records it found instead
    # the right location still works, and keeps what the records use
    r = dstl("gc", "--grace-s", "0", *job.where())
    assert r.code == 0, r.err
    assert keep <= stored(sidecar, job.job_id)
    assert decode_rows(checkpoint_rows(records(job).load(2), client)) == reference(BATCHES[:3])


def test_the_drivers_sweep_refuses_without_a_record_of_its_job(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    job = Job(tmp_path, sidecar.address, "refuse-sweep")
    job.run(client, range(3))
    keep = stored(sidecar, job.job_id)
    assert keep
    # a driver started with the wrong metadata_url (an empty place), no grace: its start
    # sweep must not take the records it cannot see for "nothing referenced"
    coord = job.coordinator(
        client=client, orphan_grace_s=0.0, metadata_url=str(tmp_path / "elsewhere")
    )
    coord.close()
    assert coord.latest is None and coord.orphans_removed == 0
    assert keep <= stored(sidecar, job.job_id)
    # the same at the right place: records of this job read, the sweep runs
    coord = job.coordinator(client=client, orphan_grace_s=0.0)
    coord.close()
    assert coord.latest is not None and referenced(job) <= stored(sidecar, job.job_id)


# ----------------------------------------------------------------- restore


def test_a_refused_restore_changes_nothing(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    job = Job(tmp_path, sidecar.address, "refuse-restore")
    job.run(client, range(5))
    before = {b: records(job).load(b).to_bytes() for b in records(job).batch_ids()}
    # a Spark checkpoint that is not this job's: its offsets of batch 3 differ from the record
    spark = job.checkpoint_dir / "spark"
    for b in range(5):
        (spark / "offsets").mkdir(parents=True, exist_ok=True)
        (spark / "offsets" / str(b)).write_text(f'v1\n{{"other": {b}}}')
    r = dstl("checkpoints", "restore", "3", *job.where())
    assert r.code == 2, r
    assert "differ from the source progress" in one_line(r.err)
    marker = job.checkpoint_dir / "dstl" / "restore.json"
    assert not marker.exists()
    assert {b: records(job).load(b).to_bytes() for b in records(job).batch_ids()} == before
    assert sorted(p.name for p in (spark / "offsets").iterdir()) == ["0", "1", "2", "3", "4"]
    # the next plain start runs normally, from the latest record (no roll back applied later)
    coord = job.coordinator(client=client)
    try:
        assert coord.restored is None
        assert coord.latest is not None and coord.latest.batch_id == 4
    finally:
        coord.close()
    # a restore of a batch that is not retained is refused before anything too
    r = dstl("checkpoints", "restore", "0", "--no-spark", *job.where())
    assert r.code == 2 and "not a retained checkpoint" in one_line(r.err)
    assert not marker.exists()
    # an accepted one (Spark's progress left alone) is done, and a start finds it done
    r = dstl("checkpoints", "restore", "3", "--no-spark", *job.where())
    assert r.code == 0, r.err
    assert json.loads(marker.read_text())["done"] is True
    assert records(job).batch_ids() == [2, 3]
    job.run(client, range(4, 5), materialize_at=())
    assert records(job).batch_ids() == [2, 3, 4]
    assert decode_rows(checkpoint_rows(records(job).load(4), client)) == reference(BATCHES[:5])


# ---------------------------------------------------------- corrupt metadata


def test_corrupt_records_and_overrides_are_one_line_errors_naming_the_file(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    from dstl_client.coordinator.metadata import CorruptMetadata

    job = Job(tmp_path, sidecar.address, "corrupt-meta")
    job.run(client, range(3))
    name = job.checkpoint_dir / "dstl" / "checkpoints" / "ck-000000000002.json"
    good = json.loads(name.read_text())
    keep = stored(sidecar, job.job_id)

    def with_(**changes: object) -> bytes:
        doc = dict(good)
        for k, v in changes.items():
            if v is KeyError:
                del doc[k]
            else:
                doc[k] = v
        text = json.dumps(doc)
        return text.replace('"@HUGE@"', "1" + "0" * 400).encode()

    cases = {
        "not JSON": b"{not json",
        "subtasks: missing": with_(subtasks=KeyError),
        "batch_id": with_(batch_id="x"),
        "created_unix": with_(created_unix="@HUGE@"),
        "max_parallelism": with_(max_parallelism="@HUGE@"),
        "segments[0]": with_(segments=[[2, 0, 31, "!!not base64!!"]]),
        "kg_map[0]": with_(kg_map=[[0, 1]]),
        "the record": b"[1, 2]",
        "holds the record of batch 1": with_(batch_id=1),
    }
    for what, data in cases.items():
        name.write_bytes(data)
        for argv in (("checkpoints", "list"), ("checkpoints", "show", "2"), ("gc",)):
            r = dstl(*argv, *job.where())
            assert r.code == 2, (what, argv, r)
            line = one_line(r.err)
            assert str(name) in line and what in line, (what, argv, line)
        with pytest.raises(CorruptMetadata, match=what.replace("[", r"\[").replace("]", r"\]")):
            records(job).load(2)
    assert keep <= stored(sidecar, job.job_id)  # the gc refused: nothing went
    name.write_text(json.dumps(good))

    overrides = job.checkpoint_dir / "dstl" / "config-overrides.json"
    for text, what in (
        ("{nope", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"checkpointTimeout": "abc"}', "checkpointTimeout"),
        ('{"checkpointTimeout": 1e400}', "checkpointTimeout"),
        ('{"checkpointTimeout": 1' + "0" * 400 + "}", "at most"),
        ('{"materializationInterval": null}', "materializationInterval"),
    ):
        overrides.write_text(text)
        with pytest.raises(CorruptMetadata, match=what) as info:
            job.coordinator(client=client)
        assert str(overrides) in info.value.message
    overrides.unlink()
    marker = job.checkpoint_dir / "dstl" / "restore.json"
    marker.write_text('{"batch_id": "3", "done": false}')
    with pytest.raises(CorruptMetadata, match="batch_id"):
        job.coordinator(client=client)
    marker.unlink()
    job.run(client, range(3, 4))  # all well again


def test_a_start_refuses_restore_from_before_changing_anything_and_finishes_with_its_spark(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    """restore_from with another max_parallelism is refused before the roll back (it was
    refused only after records and Spark's progress had moved); a begun restore is
    finished with the Spark checkpoint it was begun with (--no-spark: left alone)."""
    import dataclasses

    from dstl_client.coordinator.coordinator import CheckpointCoordinator
    from dstl_client.core.errors import ConfigError

    job = Job(tmp_path, sidecar.address, "refuse-start")
    job.run(client, range(5))
    base = job.coordinator(client=client)
    base.close()
    cfg = dataclasses.replace(
        base.config, max_parallelism=base.config.max_parallelism * 2, restore_from=3
    )
    with pytest.raises(ConfigError, match="max_parallelism"):
        CheckpointCoordinator(cfg, client=client).start()
    marker = job.checkpoint_dir / "dstl" / "restore.json"
    assert not marker.exists() and records(job).batch_ids() == [2, 3, 4]
    # a restore begun with --no-spark and interrupted: Spark's checkpoint (not this job's
    # progress: a roll back would be refused) is left alone when a start finishes it
    spark = job.checkpoint_dir / "spark" / "offsets"
    spark.mkdir(parents=True)
    for b in range(5):
        (spark / str(b)).write_text(f'v1\n{{"other": {b}}}')
    marker.write_text(json.dumps({"batch_id": 3, "done": False, "spark_dir": None}))
    coord = job.coordinator(client=client)
    coord.close()
    assert coord.restored is not None and coord.restored.superseded == (4,)
    assert json.loads(marker.read_text())["done"] is True
    assert sorted(p.name for p in spark.iterdir()) == ["0", "1", "2", "3", "4"]
