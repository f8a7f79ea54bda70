"""``dstl objects inspect KEY``: the sections of one object, their key groups, checksums verified.

Two ways to read an object:

* **through the sidecar** (default; works on ``file://`` and S3 alike, no
  storage credentials): the sidecar has no "read a whole object" call, so
  the sections are found through the job's records (retained and
  superseded, every operator): each handle entry naming the object is one
  log section (log id, offset, length, SQN range). Each section is read with
  ``ReadChanges`` over a handle of that entry alone: the sidecar checks the
  section header's CRC32C, its log id and SQN range, and every key-group
  block's CRC32C before it answers. Sections no record names (an orphan's,
  or another job's writers never recorded) cannot be found this way.
* **from the store directly** (``--storage file:///root``, the sidecar's
  ``--storage``): the object file is parsed with
  :mod:`dstl_client.core.format` (header, footer, every section header and
  every block: all checksums) and every section is listed, named or not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.client import ChangelogClient
from dstl_client.core.errors import ConfigError, CorruptObject, DstlError
from dstl_client.core.format import parse_kg_block, parse_log_header, verify_object
from dstl_client.core.handle import ChangelogHandle, HandleEntry
from dstl_client.core.keys import check_key_of_job


@dataclass(slots=True)
class SectionInfo:
    """One log section of the object."""

    log_id: str
    offset: int
    length: int
    first_sqn: int
    end_sqn: int
    #: key group -> [changesets, changes, bytes]
    key_groups: dict[int, list[int]] = field(default_factory=dict)
    #: which records name it: ``operator@batch kind`` (part, changelog, operator state)
    referenced_by: list[str] = field(default_factory=list)
    verified: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "log_id": self.log_id,
            "offset": self.offset,
            "length": self.length,
            "sqn_range": [self.first_sqn, self.end_sqn],
            "key_groups": {
                str(kg): {"changesets": c, "changes": n, "bytes": b}
                for kg, (c, n, b) in sorted(self.key_groups.items())
            },
            "referenced_by": self.referenced_by,
            "checksums_verified": self.verified,
        }


def _handles(record: CheckpointRecord) -> Iterable[tuple[str, ChangelogHandle]]:
    for pid, h in sorted(record.parts.items()):
        yield f"part {pid[:8]}", h
    for s in record.segments:
        yield f"changelog of batch {s.batch}", s.handle
    for i, h in record.operator_state:
        yield f"operator state of subtask {i}", h


def references(
    key: str, records: Iterable[tuple[str, CheckpointRecord]]
) -> dict[tuple[str, int], tuple[SectionInfo, ChangelogHandle, HandleEntry]]:
    """The sections of ``key`` the records name: ``(log id, offset)`` -> (info, handle, entry)."""
    out: dict[tuple[str, int], tuple[SectionInfo, ChangelogHandle, HandleEntry]] = {}
    for label, record in records:
        for what, handle in _handles(record):
            for e in handle.entries:
                if e.object_key != key:
                    continue
                k = (handle.log_id, e.offset)
                if k not in out:
                    info = SectionInfo(handle.log_id, e.offset, e.length, e.first_sqn, e.end_sqn)
                    out[k] = (info, handle, e)
                ref = f"{label}: {what}"
                if ref not in out[k][0].referenced_by:
                    out[k][0].referenced_by.append(ref)
    return out


def inspect_via_sidecar(
    client: ChangelogClient,
    job_id: str,
    key: str,
    records: Iterable[tuple[str, CheckpointRecord]],
) -> list[SectionInfo]:
    """Every section of ``key`` the records name, read and verified by the sidecar."""
    found = references(key, records)
    out: list[SectionInfo] = []
    for info, handle, entry in sorted(found.values(), key=lambda t: t[0].offset):
        one = ChangelogHandle(
            job_id=handle.job_id or job_id,
            log_id=handle.log_id,
            key_group_range=handle.key_group_range,
            from_sqn=entry.first_sqn,
            to_sqn=entry.end_sqn,
            entries=(entry,),
        )
        seen: set[tuple[int, int]] = set()
        for view in client.read_changesets(one):
            c = info.key_groups.setdefault(view.key_group, [0, 0, 0])
            if (view.key_group, view.sqn) not in seen:  # a large changeset comes in pieces
                seen.add((view.key_group, view.sqn))
                c[0] += 1
            c[1] += view.count
            c[2] += view.nbytes
        info.verified = True
        out.append(info)
    return out


def object_path(storage: str, job_id: str, key: str) -> Path:
    """The file of ``key`` in a ``file://`` store root (the sidecar's ``--storage``)."""
    parts = urlsplit(storage)
    if parts.scheme != "file" or parts.netloc or not parts.path.startswith("/"):
        raise ConfigError(
            f"--storage {storage!r}: only file:///absolute/path can be read directly; for "
            "S3 leave --storage out (the object is read through the sidecar)"
        )
    try:
        check_key_of_job(job_id, key)
    except DstlError as exc:
        raise ConfigError(exc.message) from None
    return Path(parts.path) / key


def inspect_file(
    data: bytes, records: Iterable[tuple[str, CheckpointRecord]], key: str
) -> list[SectionInfo]:
    """Every section of a whole object, every checksum verified (:class:`CorruptObject`)."""
    index = verify_object(data)
    named = references(key, records)
    mv = memoryview(data)
    out: list[SectionInfo] = []
    for log_id, (off, length) in sorted(index.sections.items(), key=lambda kv: kv[1][0]):
        sec = mv[off : off + length]
        hdr = parse_log_header(sec, length)
        info = SectionInfo(log_id.hex(), off, length, hdr.first_sqn, hdr.end_sqn, verified=True)
        for kg, (koff, klen) in sorted(hdr.key_groups.items()):
            c = info.key_groups.setdefault(kg, [0, 0, 0])
            for view in parse_kg_block(kg, sec[koff : koff + klen]):
                c[0] += 1
                c[1] += view.count
                c[2] += view.nbytes
        ref = named.get((info.log_id, off))
        if ref is not None:
            info.referenced_by = ref[0].referenced_by
        out.append(info)
    for named_log, named_off in named:
        if not any(s.log_id == named_log and s.offset == named_off for s in out):
            raise CorruptObject(
                f"{key}: the records name a section of log {named_log} at offset {named_off} that the "
                "object's footer does not list"
            )
    return out
