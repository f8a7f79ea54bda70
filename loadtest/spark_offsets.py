"""Which input files each committed micro-batch read, from Spark's own checkpoint.

The jobs of the tests and benchmarks read one Parquet file per micro-batch
(``maxFilesPerTrigger=1``), but a query stopped while Spark plans a batch
breaks that one-to-one mapping: the file source has already logged its next
file in ``sources/0/`` while the offsets log has no entry for the batch yet,
so the next run's first batch reads that file *and* a new one (every file is
still read exactly once). A job that stops "after batch N" can therefore run
out of input before batch N exists; a job that must consume its whole input
waits for the files instead (:func:`wait_for_all_input`), and the expected
outputs follow the groups Spark really used (:func:`file_groups`).

Reads a local checkpoint directory; any thread may call these.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def file_groups(spark_ckpt: Path) -> list[range]:
    """Input file indexes of each micro-batch Spark committed, in batch order.

    Batch ``b`` read files ``groups[b]``: from the end of the previous
    batch's ``logOffset`` (the file source's offset, one per file) to its own.
    """
    groups: list[range] = []
    end = -1
    commits = sorted(int(p.name) for p in (spark_ckpt / "commits").glob("[0-9]*"))
    for b in commits:
        last_line = (spark_ckpt / "offsets" / str(b)).read_text().strip().splitlines()[-1]
        new_end = int(json.loads(last_line)["logOffset"])
        groups.append(range(end + 1, new_end + 1))
        end = new_end
    return groups


def wait_for_all_input(
    last_recorded: Callable[[], int],
    spark_ckpt: Path,
    files: int,
    timeout_s: float,
    check: Callable[[], None] = lambda: None,
) -> list[range]:
    """Until Spark committed all ``files`` input files and dstl recorded that batch.

    ``last_recorded()``: the job's last recorded batch id; ``check()`` is
    called at each poll and raises if the job can no longer get there (its
    query stopped). Returns the file
    groups; raises :class:`TimeoutError` (with the groups so far) after
    ``timeout_s``. Polls every 0.2 s: Spark's checkpoint files have no event
    to await.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        groups = file_groups(spark_ckpt)
        if groups and groups[-1].stop == files and last_recorded() >= len(groups) - 1:
            return groups
        check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every input file was checkpointed in {timeout_s}s: {groups}")
        time.sleep(0.2)


def run_until_all_input(query: Any, checkpoint_dir: str, files: int, timeout_s: float) -> None:
    """A job driver's wait: until every one of ``files`` input files is in a batch Spark
    committed and ``query`` (a ``DstlQuery``) recorded; prints the file groups Spark used."""
    from dstl_client.coordinator.config import spark_location

    groups = wait_for_all_input(
        lambda: query.last_batch_id,
        Path(spark_location(checkpoint_dir)),
        files,
        timeout_s,
        check=query.raise_if_stopped,
    )
    print(f"every input file recorded: {[(g.start, g.stop) for g in groups]}", flush=True)
