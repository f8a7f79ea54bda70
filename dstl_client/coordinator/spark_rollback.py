"""Rolling a Spark checkpoint back to batch N: Spark's log entries of later batches moved aside.

Step 3 of a restore (:mod:`.rollback`), for a local or ``file://``
``checkpointLocation`` only: the entries of batches > N of ``offsets/``,
``commits/`` and each ``sources/<i>/`` metadata log (with their ``.crc``
files) go to ``<parent>/superseded/<time>-to-<N>/<spark folder>/``, so Spark
finds N as its last committed batch and plans N+1 from N's end offsets (a
file source finds the files of the later batches unseen again). Its
``offsets/N`` must be the source progress recorded in record N (else the
Spark checkpoint is not this job's: refused). A source log compacted at a
batch > N cannot be cut back (refused; Spark compacts a file source's log
every 10 batches).

:func:`plan_spark_rollback` checks everything and moves nothing;
:meth:`SparkRollback.apply` moves, idempotently. Thread: plain functions of
the caller's thread, on a stopped job.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dstl_client.coordinator.config import url_scheme
from dstl_client.core.errors import ConfigError

__all__ = ["SparkRollback", "local_path", "plan_spark_rollback", "roll_back_spark"]

#: Spark's logs whose entries are named by batch id
_SPARK_LOGS = ("offsets", "commits")


def _spark_batch(name: str) -> tuple[int, bool] | None:
    """``(batch, compacted)`` of a Spark metadata log file name (``4``, ``.4.crc``, ``9.compact``)."""
    n = name
    if n.startswith(".") and n.endswith(".crc"):
        n = n[1:-4]
    compact = n.endswith(".compact")
    if compact:
        n = n[: -len(".compact")]
    return (int(n), compact) if n.isdigit() else None


def local_path(location: str) -> Path | None:
    """The folder of a local or ``file://`` location; ``None`` for any other scheme."""
    scheme = url_scheme(location)
    if scheme not in ("", "file"):
        return None
    return Path(urlsplit(location).path if scheme else location)


def _offsets_lines(path: Path) -> list[Any]:
    out: list[Any] = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out


@dataclass(frozen=True, slots=True)
class SparkRollback:
    """A checked roll back of a Spark checkpoint: the log entries to move aside."""

    root: Path
    todo: tuple[Path, ...]

    def apply(self, stamp: str) -> tuple[list[str], str | None]:
        """Move the entries to ``<parent>/superseded/<stamp>/<name>/``; (moved, where)."""
        if not self.todo:
            return [], None
        aside = self.root.parent / "superseded" / stamp / self.root.name
        moved: list[str] = []
        for f in self.todo:
            if not f.exists():  # moved by an earlier, interrupted attempt
                continue
            rel = f.relative_to(self.root)
            dest = aside / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
            moved.append(rel.as_posix())
        return moved, str(aside)


def roll_back_spark(
    spark_dir: str, batch_id: int, source_progress: Any, *, stamp: str
) -> tuple[list[str], str | None]:
    """Move Spark's log entries of batches > ``batch_id`` aside; (moved, where).

    :func:`plan_spark_rollback` (every check, nothing moved when one fails),
    then :meth:`SparkRollback.apply`.
    """
    return plan_spark_rollback(spark_dir, batch_id, source_progress).apply(stamp)


def plan_spark_rollback(spark_dir: str, batch_id: int, source_progress: Any) -> SparkRollback:
    """What rolling Spark's checkpoint back to ``batch_id`` moves; changes nothing.

    Nothing to move when there is no Spark checkpoint at ``spark_dir``.
    Raises :class:`ConfigError` when it is not local, when its ``offsets/``
    entry of the batch is missing or differs from ``source_progress`` (the
    record's), or when a source log was compacted past the batch.
    """
    root = local_path(spark_dir)
    if root is None:
        raise ConfigError(
            f"the Spark checkpoint {spark_dir} is not on a local file system: roll it back "
            f"yourself (move the entries of batches > {batch_id} out of its offsets/, commits/ "
            "and sources/*/ folders) and restore with --no-spark"
        )
    if not root.is_dir():
        return SparkRollback(root, ())
    offsets = root / "offsets"
    if offsets.is_dir():
        mine = offsets / str(batch_id)
        if not mine.is_file():
            raise ConfigError(
                f"Spark's offsets log has no entry of batch {batch_id} ({mine}): Spark cannot "
                "resume from it"
            )
        if source_progress is not None and _offsets_lines(mine) != source_progress:
            raise ConfigError(
                f"Spark's offsets of batch {batch_id} ({mine}) differ from the source progress "
                "recorded in its checkpoint: is this the job's Spark checkpoint?"
            )
    logs = [root / d for d in _SPARK_LOGS]
    sources = root / "sources"
    if sources.is_dir():
        logs += sorted(p for p in sources.iterdir() if p.is_dir())
    todo: list[Path] = []
    for folder in logs:
        if not folder.is_dir():
            continue
        for f in sorted(folder.iterdir()):
            parsed = _spark_batch(f.name)
            if parsed is None or parsed[0] <= batch_id:
                continue
            if parsed[1]:
                raise ConfigError(
                    f"Spark compacted its source log at batch {parsed[0]} ({f}), after batch "
                    f"{batch_id}: the source cannot be rolled back that far"
                )
            todo.append(f)
    return SparkRollback(root, tuple(todo))
