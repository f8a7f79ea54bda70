"""The record of a batch: the previous checkpoint record plus the batch's task results.

Pure functions of frozen data, safe from any thread; the driver's coordinator
calls :func:`next_record` once per completed batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dstl_client.checkpoint.messages import TaskResult
from dstl_client.checkpoint.records import (
    NO_BATCH,
    CheckpointRecord,
    Segment,
    SubtaskInfo,
    compress_kg_map,
)
from dstl_client.checkpoint.stats import CheckpointStats
from dstl_client.core.errors import InvalidArgument
from dstl_client.core.handle import ChangelogHandle


def next_record(
    prev: CheckpointRecord | None,
    *,
    job_id: str,
    operator_id: str,
    batch_id: int,
    max_parallelism: int,
    parallelism: int,
    results: Iterable[TaskResult],
    source_progress: Any = None,
    created_unix: float = 0.0,
    stats: CheckpointStats | None = None,
    state_schema: str | None = None,
) -> CheckpointRecord:
    """The record of ``batch_id``: ``prev`` plus the batch's task results.

    ``state_schema``: the id of the schema document this run declared (not
    carried over from ``prev``: each run records what it declared).

    Materializations move key groups to new parts (uploaded), to nothing
    (cleared) or re-reference their part as of the new batch (unchanged);
    segments every key group of which is covered by a materialization taken at
    or after their batch are dropped, and so are parts no key group uses.
    """
    results = list(results)  # read twice
    per_kg: list[tuple[str | None, int]] = (
        prev.mat_per_kg() if prev is not None else [(None, NO_BATCH)] * max_parallelism
    )
    if prev is not None and prev.max_parallelism != max_parallelism:
        raise InvalidArgument(
            f"max_parallelism changed from {prev.max_parallelism} to {max_parallelism}: "
            "it is fixed when a job is created"
        )
    parts = dict(prev.parts) if prev is not None else {}
    segments = list(prev.segments) if prev is not None else []
    subtasks: list[SubtaskInfo] = []
    for r in sorted(results, key=lambda r: r.index):
        subtasks.append(SubtaskInfo(r.index, r.first, r.last, r.attempt))
        if r.mat is not None:
            m = r.mat
            uploaded = set(m.uploaded)
            cleared = set(m.cleared)
            pid = m.part_id
            if pid is not None and m.part is not None:
                parts[pid] = m.part
            for kg in range(r.first, r.last + 1):
                if m.batch < per_kg[kg][1]:
                    continue  # an older materialization than the recorded one: never goes back
                if kg in uploaded:
                    per_kg[kg] = (pid, m.batch)
                elif kg in cleared:
                    per_kg[kg] = (None, m.batch)
                else:
                    per_kg[kg] = (per_kg[kg][0], m.batch)
        if r.changelog is not None:
            segments.append(Segment(batch_id, r.first, r.last, r.changelog))
    kept = [
        s for s in segments if any(per_kg[kg][1] < s.batch for kg in range(s.first, s.last + 1))
    ]
    used = {p for p, _ in per_kg if p is not None}
    return CheckpointRecord(
        job_id=job_id,
        operator_id=operator_id,
        batch_id=batch_id,
        max_parallelism=max_parallelism,
        parallelism=parallelism,
        subtasks=tuple(subtasks),
        kg_map=tuple(compress_kg_map(per_kg)),
        parts={pid: h for pid, h in parts.items() if pid in used},
        segments=tuple(sorted(kept, key=lambda s: (s.batch, s.first))),
        source_progress=source_progress,
        created_unix=created_unix,
        stats=stats,
        operator_state=_operator_state(prev, parallelism, results),
        state_schema=state_schema,
    )


def _operator_state(
    prev: CheckpointRecord | None, parallelism: int, results: Iterable[TaskResult]
) -> tuple[tuple[int, ChangelogHandle], ...]:
    """Each subtask's operator-state handle: the one it wrote, else the recorded one.

    A recorded handle is carried over only while the parallelism is
    unchanged: after a rescale every subtask rewrites its redistributed lists.
    """
    carried = dict(prev.operator_state) if prev is not None else {}
    same = prev is not None and prev.parallelism == parallelism
    out: dict[int, ChangelogHandle] = {}
    for r in results:
        if r.op_state is not None:
            out[r.index] = r.op_state
        elif same and r.index in carried:
            out[r.index] = carried[r.index]
        elif carried and not same:
            raise InvalidArgument(
                f"subtask {r.index} did not rewrite its operator state after a rescale"
            )
    return tuple(sorted(out.items()))
