"""The materialization slot of one node-local store: which one runs, and how it ended.

A materialization runs in the background across batches (as in Flink's
FLIP-158): the task that starts it returns without waiting, and a later task
of the same subtask, in any Python worker of the node, reports its outcome to
the driver. The slot is how they meet, two files in the store's directory:

* ``mat.lock``: an exclusive ``flock`` held by the materialization's thread for
  its whole run. The OS releases it if that process dies, so "locked" means
  running and "free" means not running, with no pid or clock to trust.
* ``mat.json``: the :class:`SlotRecord`, written atomically (temporary file,
  ``fsync``, rename): ``running`` when started, then ``done`` or ``failed``
  with the outcome, written before the lock is released. A ``running`` record
  under a free lock is a materialization whose process exited. Every record
  names the driver's round that started it; it means nothing to another
  round (of another driver run, say), which clears it.

Threads: :meth:`MaterializationSlot.claim`, :meth:`~MaterializationSlot.read`
and :meth:`~MaterializationSlot.clear` on the task's thread while it holds the
store's lock; :meth:`~MaterializationSlot.write` also on the materialization's
thread, which owns the claim it was handed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstl_client.checkpoint.messages import MatFailure, MatResult

log = logging.getLogger(__name__)

LOCK_NAME = "mat.lock"
RECORD_NAME = "mat.json"

RUNNING = "running"
DONE = "done"
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class MatOutcome:
    """The end of one materialization of version ``batch``: its result or its error, and figures.

    Invariant: ``failure`` (the kind) is set exactly when ``error`` (the words) is.
    """

    batch: int = -1
    result: MatResult | None = None
    error: str = ""
    failure: MatFailure | None = None
    seconds: float = 0.0
    bytes: int = 0
    kgs: int = 0
    dirty_kgs: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "result": None if self.result is None else self.result.to_json(),
            "error": self.error,
            "failure": None if self.failure is None else self.failure.value,
            "seconds": self.seconds,
            "bytes": self.bytes,
            "kgs": self.kgs,
            "dirty_kgs": self.dirty_kgs,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> MatOutcome:
        r = doc.get("result")
        return cls(
            batch=int(doc["batch"]),
            result=None if r is None else MatResult.from_json(r),
            error=str(doc.get("error") or ""),
            failure=MatFailure.of(doc.get("failure"), str(doc.get("error") or "")),
            seconds=float(doc.get("seconds") or 0.0),
            bytes=int(doc.get("bytes") or 0),
            kgs=int(doc.get("kgs") or 0),
            dirty_kgs=int(doc.get("dirty_kgs") or 0),
        )


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """What ``mat.json`` says: the version materialized, for which round, its status, and
    its outcome once ended.

    ``round_id`` is the driver's id of the round that started it; a record
    without one (written before rounds had ids) matches no round.
    """

    batch: int
    status: str
    outcome: MatOutcome | None = None
    round_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "round": self.round_id,
            "status": self.status,
            "outcome": None if self.outcome is None else self.outcome.to_json(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SlotRecord:
        o = doc.get("outcome")
        status = str(doc["status"])
        if status not in (RUNNING, DONE, FAILED):
            raise ValueError(f"unknown status {status!r}")
        return cls(
            int(doc["batch"]),
            status,
            None if o is None else MatOutcome.from_json(o),
            str(doc.get("round") or ""),
        )


class SlotClaim:
    """The right to run the slot's one materialization: an open, locked ``mat.lock``.

    Released exactly once, by whoever holds it last (the task, or the
    materialization's thread it was handed to); the OS releases it if the
    process dies first.
    """

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class MaterializationSlot:
    """The slot of the store in ``directory`` (see the module docstring for its invariants)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def claim(self) -> SlotClaim | None:
        """The claim if no materialization runs now, else ``None`` (never waits)."""
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return None
            raise
        return SlotClaim(fd)

    def read(self) -> SlotRecord | None:
        """The record, or ``None`` if there is none (an unreadable one is dropped, and logged)."""
        path = self.directory / RECORD_NAME
        try:
            doc = json.loads(path.read_bytes())
            return SlotRecord.from_json(doc)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("dropping unreadable materialization record %s: %s", path, exc)
            self.clear()
            return None

    def write(self, record: SlotRecord) -> None:
        """Replace the record atomically (durable before it is visible)."""
        path = self.directory / RECORD_NAME
        tmp = path.with_name(f".{RECORD_NAME}.{os.getpid()}.tmp")
        data = json.dumps(record.to_json(), separators=(",", ":")).encode()
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / RECORD_NAME).unlink()
