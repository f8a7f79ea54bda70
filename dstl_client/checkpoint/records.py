"""Checkpoint records: what the driver keeps of each checkpoint.

A checkpoint is one micro-batch. Its record (JSON, written once, never
overwritten) says, for the whole keyed operator:

* ``batch_id`` and the ``source_progress`` (Spark's offsets) it covers;
* ``subtasks``: per subtask its key-group range and the attempt id whose
  results were committed (tasks compare it with their local store's version);
* ``kg_map``: per key group the materialized part holding its state and the
  batch that state is valid through (run-length encoded over key groups);
  ``parts``: those parts' handles (a part is the snapshot one subtask
  uploaded at one materialization);
* ``segments``: the changelog since the materialization, one handle per
  subtask and batch, with the key-group range of the writer and the batch;
* ``operator_state``: per subtask (of ``parallelism``) the handle of its
  operator (non-keyed) lists, if it has any (see
  :mod:`dstl_client.state.operator_state`);
* ``state_schema``: the id of the operator's state schema document, when its
  states declared schemas (a processor's; see :mod:`dstl_client.coordinator.state_schemas`). Absent
  in older records and for ``process_keyed``: readers then need serializers.

Restoring key group ``kg``: load its rows from ``parts[kg_map[kg].part]``,
then replay, in batch order, every segment holding ``kg`` whose batch is
after ``kg_map[kg].batch``. Key groups are the unit, so any parallelism
restores from any record (rescaling).

Every object a record references (``object_keys``) is counted by the shared
state registry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstl_client.checkpoint.codec import (
    CorruptMetadata,
    FieldError,
    handle_from_text,
    handle_to_text,
    json_field,
    json_int,
    json_list,
    json_number,
    json_object,
    json_str,
    shown,
)
from dstl_client.checkpoint.stats import CheckpointStats
from dstl_client.core.errors import InvalidArgument
from dstl_client.core.handle import ChangelogHandle
from dstl_client.keygroups import MAX_MAX_PARALLELISM, KeyGroupRange

RECORD_FORMAT = 1
NO_BATCH = -1
#: the largest batch id a record can have (its name holds 12 digits)
MAX_BATCH_ID = 10**12 - 1
_SCHEMA_ID = re.compile(r"[0-9a-f]{8,64}")


@dataclass(frozen=True, slots=True)
class SubtaskInfo:
    """One subtask of a committed batch: its range and the committed attempt."""

    index: int
    first: int
    last: int
    attempt: str

    @property
    def kg_range(self) -> KeyGroupRange:
        return KeyGroupRange(self.first, self.last)


@dataclass(frozen=True, slots=True)
class MatEntry:
    """Run of key groups ``first..last`` whose state is ``part`` as of ``batch``.

    ``part`` is ``None`` for key groups without state; ``batch`` is
    :data:`NO_BATCH` for key groups never materialized.
    """

    first: int
    last: int
    part: str | None
    batch: int


@dataclass(frozen=True, slots=True)
class Segment:
    """The changelog of one subtask in one batch."""

    batch: int
    first: int
    last: int
    handle: ChangelogHandle

    @property
    def kg_range(self) -> KeyGroupRange:
        return KeyGroupRange(self.first, self.last)


def expand_kg_map(
    entries: Sequence[MatEntry], max_parallelism: int
) -> list[tuple[str | None, int]]:
    """``[(part, batch)]`` per key group."""
    out: list[tuple[str | None, int]] = [(None, NO_BATCH)] * max_parallelism
    for e in entries:
        if not 0 <= e.first <= e.last < max_parallelism:
            raise InvalidArgument(f"kg_map entry {e} outside [0, {max_parallelism})")
        for kg in range(e.first, e.last + 1):
            out[kg] = (e.part, e.batch)
    return out


def compress_kg_map(per_kg: Sequence[tuple[str | None, int]]) -> list[MatEntry]:
    """Inverse of :func:`expand_kg_map` (runs of equal entries), skipping empty runs."""
    out: list[MatEntry] = []
    start = 0
    for kg in range(1, len(per_kg) + 1):
        if kg == len(per_kg) or per_kg[kg] != per_kg[start]:
            part, batch = per_kg[start]
            if part is not None or batch != NO_BATCH:
                out.append(MatEntry(start, kg - 1, part, batch))
            start = kg
    return out


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """A completed checkpoint (see the module docstring)."""

    job_id: str
    operator_id: str
    batch_id: int
    max_parallelism: int
    parallelism: int
    subtasks: tuple[SubtaskInfo, ...]
    kg_map: tuple[MatEntry, ...] = ()
    parts: dict[str, ChangelogHandle] = field(default_factory=dict)
    segments: tuple[Segment, ...] = ()
    source_progress: Any = None
    created_unix: float = 0.0
    #: the checkpoint's figures as known when the record was written
    stats: CheckpointStats | None = None
    #: ``(subtask index, handle)`` of each subtask's operator lists, by index
    operator_state: tuple[tuple[int, ChangelogHandle], ...] = ()
    #: the id of the state schema document this checkpoint's states follow (``None``: none)
    state_schema: str | None = None

    # ------------------------------------------------------------ queries
    def object_keys(self) -> set[str]:
        """Every object this checkpoint needs (the registry's keys)."""
        keys: set[str] = set()
        for h in self.parts.values():
            keys.update(h.object_keys)
        for s in self.segments:
            keys.update(s.handle.object_keys)
        for _index, h in self.operator_state:
            keys.update(h.object_keys)
        return keys

    def subtask_for(self, kg_range: KeyGroupRange) -> SubtaskInfo | None:
        """The subtask with exactly this range, if the parallelism is unchanged."""
        for s in self.subtasks:
            if s.first == kg_range.first and s.last == kg_range.last:
                return s
        return None

    def sized(self, stats: CheckpointStats) -> CheckpointStats:
        """``stats`` with this record's sizes: segments, parts and their stored bytes."""
        return stats.with_sizes(
            segments=len(self.segments),
            parts=len(self.parts),
            size_bytes=sum(h.stored_bytes for h in self.parts.values())
            + sum(s.handle.stored_bytes for s in self.segments),
        )

    def mat_per_kg(self) -> list[tuple[str | None, int]]:
        return expand_kg_map(self.kg_map, self.max_parallelism)

    def for_tasks(self) -> CheckpointRecord:
        """A copy without what tasks do not need (sent in every batch's closure)."""
        return CheckpointRecord(
            self.job_id,
            self.operator_id,
            self.batch_id,
            self.max_parallelism,
            self.parallelism,
            self.subtasks,
            self.kg_map,
            self.parts,
            self.segments,
            operator_state=self.operator_state,
        )

    # -------------------------------------------------------------- codec
    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "job_id": self.job_id,
            "operator_id": self.operator_id,
            "batch_id": self.batch_id,
            "created_unix": self.created_unix,
            "max_parallelism": self.max_parallelism,
            "parallelism": self.parallelism,
            "source_progress": self.source_progress,
            "subtasks": [[s.index, s.first, s.last, s.attempt] for s in self.subtasks],
            "kg_map": [[e.first, e.last, e.part, e.batch] for e in self.kg_map],
            "parts": {pid: handle_to_text(h) for pid, h in sorted(self.parts.items())},
            "segments": [
                [s.batch, s.first, s.last, handle_to_text(s.handle)] for s in self.segments
            ],
            "stats": None if self.stats is None else self.stats.to_json(),
            "operator_state": [[i, handle_to_text(h)] for i, h in self.operator_state],
            **({} if self.state_schema is None else {"state_schema": self.state_schema}),
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(
        cls, doc: dict[str, Any], *, where: str = "checkpoint record"
    ) -> CheckpointRecord:
        """The record of a JSON object; :class:`~.codec.CorruptMetadata` naming ``where``
        and the field when any field is missing, of the wrong type or out of range."""
        try:
            return cls._decode(json_object(doc, "the record"))
        except FieldError as exc:
            raise CorruptMetadata(f"{where}: {exc}") from None
        except RecursionError:
            raise CorruptMetadata(f"{where}: nested too deeply") from None

    @classmethod
    def _decode(cls, doc: dict[str, Any]) -> CheckpointRecord:
        fmt = doc.get("format")
        if fmt != RECORD_FORMAT or isinstance(fmt, bool):
            raise FieldError(f"format: unsupported checkpoint record format {fmt!r}")
        max_p = json_int(
            json_field(doc, "max_parallelism"), "max_parallelism", 1, MAX_MAX_PARALLELISM
        )
        last_kg = max_p - 1

        def kg(value: Any, what: str) -> int:
            return json_int(value, what, 0, last_kg)

        def batch(value: Any, what: str, lo: int = 0) -> int:
            return json_int(value, what, lo, MAX_BATCH_ID)

        subtasks = []
        for n, item in enumerate(json_list(json_field(doc, "subtasks"), "subtasks")):
            w = f"subtasks[{n}]"
            i, f, la, a = json_list(item, w, 4)
            subtasks.append(
                SubtaskInfo(
                    json_int(i, f"{w} index", 0, max_p), kg(f, w), kg(la, w), json_str(a, w)
                )
            )
        kg_map = []
        for n, item in enumerate(json_list(json_field(doc, "kg_map"), "kg_map")):
            w = f"kg_map[{n}]"
            f, la, part, b = json_list(item, w, 4)
            kg_map.append(
                MatEntry(
                    kg(f, w),
                    kg(la, w),
                    None if part is None else json_str(part, w),
                    batch(b, w, NO_BATCH),
                )
            )
        parts = {
            pid: handle_from_text(h, f"parts[{pid!r}]")
            for pid, h in json_object(json_field(doc, "parts"), "parts").items()
        }
        segments = []
        for n, item in enumerate(json_list(json_field(doc, "segments"), "segments")):
            w = f"segments[{n}]"
            b, f, la, h = json_list(item, w, 4)
            segments.append(Segment(batch(b, w), kg(f, w), kg(la, w), handle_from_text(h, w)))
        operator_state = []
        for n, item in enumerate(json_list(doc.get("operator_state") or [], "operator_state")):
            w = f"operator_state[{n}]"
            i, h = json_list(item, w, 2)
            operator_state.append((json_int(i, w, 0, max_p), handle_from_text(h, w)))
        stats_doc = doc.get("stats")
        try:
            stats = CheckpointStats.from_json(stats_doc) if stats_doc else None
        except FieldError as exc:
            raise FieldError(f"stats: {exc}") from None
        schema_doc = doc.get("state_schema")
        state_schema = None if schema_doc is None else json_str(schema_doc, "state_schema")
        if state_schema is not None and not _SCHEMA_ID.fullmatch(state_schema):
            raise FieldError(f"state_schema: {shown(state_schema)} is not a schema id (hex)")
        return cls(
            job_id=json_str(json_field(doc, "job_id"), "job_id"),
            operator_id=json_str(json_field(doc, "operator_id"), "operator_id"),
            batch_id=batch(json_field(doc, "batch_id"), "batch_id"),
            max_parallelism=max_p,
            parallelism=json_int(json_field(doc, "parallelism"), "parallelism", 1, max_p),
            subtasks=tuple(subtasks),
            kg_map=tuple(kg_map),
            parts=parts,
            segments=tuple(segments),
            source_progress=doc.get("source_progress"),
            created_unix=json_number(doc.get("created_unix", 0.0), "created_unix"),
            stats=stats,
            operator_state=tuple(operator_state),
            state_schema=state_schema,
        )

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "checkpoint record") -> CheckpointRecord:
        """:meth:`from_json` of the bytes; :class:`~.codec.CorruptMetadata` naming ``where``."""
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise CorruptMetadata(f"{where}: not JSON ({exc})") from None
        return cls.from_json(doc, where=where)
