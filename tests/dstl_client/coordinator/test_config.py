"""Configuration (defaults defined once, the query's options) and typed statistics."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dstl_client.coordinator.config import CheckpointSettings, CoordinatorConfig
from dstl_client.coordinator.messages import TaskResult, TaskStats
from dstl_client.coordinator.stats import CheckpointStats
from dstl_client.core.errors import ConfigError
from dstl_client.spark.options import KeyedOptions, default_job_id


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
    keyed = CoordinatorConfig(job_id="j", checkpoint_dir=str(tmp_path))
    other = dataclasses.replace(keyed, operator_id="other")
    assert keyed.records_dir == tmp_path / "dstl" / "checkpoints"
    assert keyed.overrides_path == tmp_path / "dstl" / "config-overrides.json"
    assert other.records_dir == tmp_path / "dstl" / "operators" / "other" / "checkpoints"
    assert keyed.other_records_dirs() == [] and other.other_records_dirs() == []
    keyed.records_dir.mkdir(parents=True)
    other.records_dir.mkdir(parents=True)
    assert keyed.other_records_dirs() == [other.records_dir]
    assert other.other_records_dirs() == [keyed.records_dir]
    opts = KeyedOptions(checkpoint_dir=str(tmp_path), parallelism=1)
    assert opts.spark_checkpoint_dir == tmp_path / "spark"
    assert dataclasses.replace(opts, operator_id="b").spark_checkpoint_dir == tmp_path / "spark-b"


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
