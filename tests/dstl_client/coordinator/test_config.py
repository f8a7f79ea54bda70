"""Configuration (defaults defined once, the query's options) and typed statistics."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dstl_client.batch.options import KeyedOptions, default_job_id
from dstl_client.checkpoint.messages import TaskResult
from dstl_client.checkpoint.stats import CheckpointStats, TaskStats
from dstl_client.coordinator.config import CheckpointSettings, CoordinatorConfig
from dstl_client.coordinator.metadata import FileMetadataStore
from dstl_client.core.errors import ConfigError


def test_keywords_map_onto_the_options_and_the_defaults_are_the_coordinators() -> None:
    opts = KeyedOptions.of(None, {"parallelism": 2, "checkpoint_dir": "/c", "retain": 3})
    assert opts.parallelism == 2 and opts.retain == 3
    cfg = opts.coordinator_config()
    assert cfg.job_id == default_job_id("/c") and cfg.checkpoint_dir == "/c" and cfg.retain == 3
    # every checkpoint setting the options leave alone is the coordinator's default
    plain = CoordinatorConfig(job_id="j", checkpoint_dir="/c")
    for f in dataclasses.fields(CheckpointSettings):
        if f.name != "retain":
            assert getattr(cfg, f.name) == getattr(plain, f.name), f.name
    # a given options object, with keywords over it
    again = KeyedOptions.of(opts, {"parallelism": 4, "dstl_address": None})
    assert again.parallelism == 4 and again.retain == 3 and again.dstl_address == ""
    assert KeyedOptions.of(opts, {}) is not None


def test_unknown_and_missing_keywords_are_refused() -> None:
    with pytest.raises(TypeError, match="paralelism"):
        KeyedOptions.of(None, {"paralelism": 2, "checkpoint_dir": "/c"})
    with pytest.raises(TypeError, match="swept through the sidecar"):
        KeyedOptions.of(None, {"parallelism": 2, "checkpoint_dir": "/c", "storage_url": "x"})
    with pytest.raises(TypeError, match="checkpoint_dir"):
        KeyedOptions.of(None, {"parallelism": 2})
    with pytest.raises(ConfigError):
        KeyedOptions.of(None, {"parallelism": 0, "checkpoint_dir": "/c"}).validate()
    with pytest.raises(ConfigError):
        CoordinatorConfig(job_id="j", checkpoint_dir="/c", operator_id="../x").validate()


def test_layout_of_the_default_and_other_operators(tmp_path: Path) -> None:
    keyed = CoordinatorConfig(job_id="j", checkpoint_dir=str(tmp_path), fsync=False)
    other = dataclasses.replace(keyed, operator_id="other")
    assert keyed.metadata_location == str(tmp_path / "dstl")
    assert keyed.records_prefix == "checkpoints/"
    assert keyed.overrides_name == "config-overrides.json"
    assert other.records_prefix == "operators/other/checkpoints/"
    assert other.overrides_name == "operators/other/config-overrides.json"
    store = keyed.open_metadata()
    assert isinstance(store, FileMetadataStore) and store.root == tmp_path / "dstl"
    assert keyed.other_records_prefixes(store) == [] and other.other_records_prefixes(store) == []
    store.put("checkpoints/ck-000000000001.json", b"{}")
    store.put("operators/other/config-overrides.json", b"{}")  # overrides alone: no records
    assert other.other_records_prefixes(store) == ["checkpoints/"]
    assert keyed.other_records_prefixes(store) == []
    store.put("operators/other/checkpoints/ck-000000000001.json", b"{}")
    store.put("operators/third/checkpoints/ck-000000000002.json", b"{}")
    assert keyed.other_records_prefixes(store) == [
        other.records_prefix,
        "operators/third/checkpoints/",
    ]
    assert other.other_records_prefixes(store) == ["checkpoints/", "operators/third/checkpoints/"]
    # the files are where they always were
    assert (tmp_path / "dstl" / "operators" / "other" / "checkpoints").is_dir()
    opts = KeyedOptions(checkpoint_dir=str(tmp_path), parallelism=1)
    assert opts.spark_checkpoint_dir == str(tmp_path / "spark")
    assert dataclasses.replace(opts, operator_id="b").spark_checkpoint_dir == str(
        tmp_path / "spark-b"
    )


def test_a_checkpoint_dir_url_is_never_mangled_into_a_path() -> None:
    opts = KeyedOptions(checkpoint_dir="s3a://bucket/ck/", parallelism=1)
    opts.validate()
    assert opts.spark_checkpoint_dir == "s3a://bucket/ck/spark"
    cfg = opts.coordinator_config()
    # s3a:// is Hadoop's name for the same bucket: the metadata goes there through s3://
    assert cfg.metadata_location == "s3://bucket/ck/dstl"
    assert cfg.job_id == default_job_id("s3://bucket/ck") and cfg.job_id.startswith("ck-")
    assert default_job_id("s3a://bucket/ck") != default_job_id("s3a://bucket/other/ck")
    # a file:// URL is the same job as its path; a path is resolved
    assert default_job_id("file:///data/ck") == default_job_id("/data/ck")
    assert default_job_id("/data/x/../ck") == default_job_id("/data/ck")
    explicit = dataclasses.replace(opts, metadata_url="s3://meta/job1").coordinator_config()
    assert explicit.metadata_location == "s3://meta/job1"
    local = KeyedOptions(checkpoint_dir="file:///data/ck", parallelism=1)
    assert local.spark_checkpoint_dir == "file:///data/ck/spark"
    assert local.coordinator_config().metadata_location == "file:///data/ck/dstl"


@pytest.mark.parametrize(
    ("checkpoint_dir", "metadata_url", "message"),
    [
        ("gs://bucket/ck", "", r"on gs://.*set metadata_url"),
        ("hdfs://nn/ck", "", r"on hdfs://.*set metadata_url"),
        ("/c", "s3a://bucket/ck", r"Hadoop's scheme.*s3://bucket/ck"),
        ("/c", "gs://bucket/ck", r"unsupported job metadata URL"),
        ("/c", "file://relative/dir", r"absolute path"),
    ],
)
def test_unsupported_locations_fail_while_the_query_is_set_up(
    checkpoint_dir: str, metadata_url: str, message: str
) -> None:
    opts = KeyedOptions(checkpoint_dir=checkpoint_dir, parallelism=1, metadata_url=metadata_url)
    with pytest.raises(ConfigError, match=message):
        opts.validate()
    with pytest.raises(ConfigError, match=message):
        opts.coordinator_config().validate()
    # a URL elsewhere is fine once the metadata has a supported home
    if not metadata_url:
        dataclasses.replace(opts, metadata_url="s3://bucket/meta").validate()


def _result(index: int, stats: TaskStats, mat_error: str = "") -> TaskResult:
    return TaskResult(index, index, index, 7, "a", None, mat_error=mat_error, stats=stats)


def test_checkpoint_stats_are_sums_and_peaks_of_the_tasks() -> None:
    results = [
        _result(0, TaskStats(rows=3, persist_s=0.5, restored=True, task_attempt=1)),
        _result(1, TaskStats(rows=4, persist_s=0.25, mat_bytes=10), mat_error="E: boom"),
    ]
    stats = CheckpointStats.of_tasks(7, True, results)
    assert stats.rows == 7 and stats.persist_max_s == 0.5 and stats.mat_bytes == 10
    assert stats.restored_subtasks == 1 and stats.max_task_attempt == 1
    assert stats.mat_errors == ("E: boom",) and not stats.materialized
    done = stats.completed(record_s=0.125, discarded_objects=2, batch_s=None)
    assert done.checkpoint_s == 0.625 and done.discarded_objects == 2 and done.batch_s is None
    # JSON: readable, round trip, tolerant of missing and unknown keys
    doc = json.loads(json.dumps(done.to_json()))
    assert doc["rows"] == 7 and doc["mat_errors"] == ["E: boom"]
    assert CheckpointStats.from_json(doc) == done
    assert CheckpointStats.from_json({"rows": 5, "renamed": 1}) == CheckpointStats(rows=5)
    assert TaskStats.from_json({"restored": 1, "rows": 2.0}) == TaskStats(restored=True, rows=2)
    task = results[0]
    assert TaskResult.from_bytes(task.to_bytes()) == task


def test_a_negative_tail_bound_is_refused() -> None:
    opts = KeyedOptions(checkpoint_dir="/c", parallelism=1)
    for bad, field in (
        (dataclasses.replace(opts, materialize_tail_ratio=-0.1), "materialize_tail_ratio"),
        (dataclasses.replace(opts, materialize_tail_min_bytes=-1), "materialize_tail_min_bytes"),
    ):
        with pytest.raises(ConfigError, match=field):
            bad.coordinator_config().validate()
