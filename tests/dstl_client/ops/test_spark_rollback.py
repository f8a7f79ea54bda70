"""Rolling Spark's checkpoint back to a batch: what moves aside, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstl_client.coordinator.spark_rollback import roll_back_spark
from dstl_client.core.errors import ConfigError


def offsets(b: int) -> list[object]:
    return ["v1", {"batchWatermarkMs": 0, "batchTimestampMs": 1000 + b}, {"logOffset": b}]


def spark_checkpoint(root: Path, last: int, *, compact_at: int | None = None) -> Path:
    """What a file-source query leaves: offsets, commits and the source log, with .crc files."""
    for b in range(last + 1):
        for folder, text in (
            ("offsets", "\n".join(json.dumps(x) for x in offsets(b))),
            ("commits", 'v1\n{"nextBatchWatermarkMs":0}'),
            ("sources/0", f'v1\n{{"path":"file:///in/{b}.parquet","batchId":{b}}}'),
        ):
            d = root / folder
            d.mkdir(parents=True, exist_ok=True)
            name = f"{b}.compact" if folder.startswith("sources") and b == compact_at else str(b)
            (d / name).write_text(text)
            (d / f".{name}.crc").write_bytes(b"crc")
    (root / "metadata").write_text('{"id":"q"}')
    return root


def test_entries_after_the_batch_move_aside_with_their_checksums(tmp_path: Path) -> None:
    root = spark_checkpoint(tmp_path / "ck" / "spark", 5)
    moved, aside = roll_back_spark(str(root), 3, offsets(3), stamp="t-to-3")
    assert aside == str(tmp_path / "ck" / "superseded" / "t-to-3" / "spark")
    assert len(moved) == 3 * 2 * 2  # 3 logs x batches 4, 5 x (entry, .crc)
    for folder in ("offsets", "commits", "sources/0"):
        assert sorted(p.name for p in (root / folder).iterdir() if p.name[0] != ".") == [
            "0",
            "1",
            "2",
            "3",
        ]
        assert (Path(aside) / folder / "5").is_file() and (
            Path(aside) / folder / ".4.crc"
        ).is_file()
    assert (root / "metadata").is_file()
    assert roll_back_spark(str(root), 3, offsets(3), stamp="again") == ([], None)  # idempotent
    assert roll_back_spark(str(tmp_path / "none"), 3, None, stamp="x") == ([], None)


def test_refusals(tmp_path: Path) -> None:
    root = spark_checkpoint(tmp_path / "a", 5)
    with pytest.raises(ConfigError, match="differ from the source progress"):
        roll_back_spark(str(root), 3, offsets(2), stamp="x")
    with pytest.raises(ConfigError, match="not on a local file system"):
        roll_back_spark("s3a://bucket/ck/spark", 3, None, stamp="x")
    compacted = spark_checkpoint(tmp_path / "b", 10, compact_at=9)
    with pytest.raises(ConfigError, match="compacted its source log at batch 9"):
        roll_back_spark(str(compacted), 3, offsets(3), stamp="x")
    assert (compacted / "offsets" / "10").is_file()  # nothing moved
    (root / "offsets" / "3").unlink()
    with pytest.raises(ConfigError, match="no entry of batch 3"):
        roll_back_spark(str(root), 3, None, stamp="x")
