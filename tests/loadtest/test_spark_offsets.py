"""Reading which input files each micro-batch took from a Spark checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.spark_offsets import file_groups, wait_for_all_input


def spark_batch(ckpt: Path, batch: int, log_offset: int, *, committed: bool = True) -> None:
    """One batch as Spark's file-source query writes it: offsets/N, then commits/N."""
    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    (ckpt / "commits").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    lines = ["v1", json.dumps(meta), json.dumps({"logOffset": log_offset})]
    (ckpt / "offsets" / str(batch)).write_text("\n".join(lines))
    (ckpt / "offsets" / f".{batch}.crc").write_bytes(b"\0")  # Spark's checksum files
    if committed:
        (ckpt / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_one_file_per_batch(tmp_path: Path) -> None:
    for b in range(3):
        spark_batch(tmp_path, b, b)
    assert file_groups(tmp_path) == [range(0, 1), range(1, 2), range(2, 3)]


def test_a_batch_after_a_stop_in_planning_reads_two_files_and_an_uncommitted_one_none(
    tmp_path: Path,
) -> None:
    spark_batch(tmp_path, 0, 0)
    spark_batch(tmp_path, 1, 2)  # the source had logged file 1 before the stop
    spark_batch(tmp_path, 2, 3, committed=False)
    assert file_groups(tmp_path) == [range(0, 1), range(1, 3)]


def test_wait_returns_once_every_file_is_committed_and_recorded(tmp_path: Path) -> None:
    spark_batch(tmp_path, 0, 0)
    spark_batch(tmp_path, 1, 2)
    assert wait_for_all_input(lambda: 1, tmp_path, 3, timeout_s=5) == [range(0, 1), range(1, 3)]


def test_wait_times_out_while_the_last_batch_is_not_recorded(tmp_path: Path) -> None:
    spark_batch(tmp_path, 0, 0)
    spark_batch(tmp_path, 1, 2)
    with pytest.raises(TimeoutError, match="not every input file"):
        wait_for_all_input(lambda: 0, tmp_path, 3, timeout_s=0.3)


def test_wait_stops_at_once_when_the_check_raises(tmp_path: Path) -> None:
    spark_batch(tmp_path, 0, 0)

    def stopped() -> None:
        raise RuntimeError("the query stopped")

    with pytest.raises(RuntimeError, match="query stopped"):
        wait_for_all_input(lambda: 0, tmp_path, 3, timeout_s=60, check=stopped)
