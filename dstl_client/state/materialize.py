"""Materialization: upload a snapshot of a subtask's committed state through the sidecar.

The key groups changed since their last recorded materialization (every key
group of the range in ``full_snapshot`` mode) are written as PUT changes
through a fresh DSTL writer and persisted; the resulting handle is the
*part*. Unchanged key groups are re-referenced by the driver, not uploaded.
A failure is reported to the driver (which counts them), never raised.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass

from dstl_client.client import ChangelogClient, ChangelogWriter
from dstl_client.coordinator.messages import BatchPlan, MatResult
from dstl_client.coordinator.records import NO_BATCH
from dstl_client.core.errors import DstlError
from dstl_client.core.handle import ChangelogHandle
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.snapshot_upload import upload_snapshot
from dstl_client.state.store import SnapshotReader

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MatOutcome:
    """The end of one materialization: its result or its error, and its figures."""

    result: MatResult | None = None
    error: str = ""
    seconds: float = 0.0
    bytes: int = 0
    kgs: int = 0
    dirty_kgs: int = 0


class Materializer:
    """Uploads the snapshot of version ``version`` of one subtask's store, in a thread.

    Invariants: it reads only through its :class:`SnapshotReader`, a
    consistent view of the version fixed when the reader was opened (the task
    goes on writing its batch meanwhile); it closes the reader and its writer
    whatever happens; :attr:`outcome` is set exactly once, by the upload thread,
    and read by the task only after :meth:`join` saw that thread end.

    Threads: :meth:`start` and :meth:`join` on the task's thread; the upload
    on a daemon thread of its own.
    """

    def __init__(
        self,
        plan: BatchPlan,
        index: int,
        kg_range: KeyGroupRange,
        client: ChangelogClient,
        reader: SnapshotReader,
        version: int,
    ) -> None:
        self.plan = plan
        self.index = index
        self.kg_range = kg_range
        self.client = client
        self._reader = reader
        self.version = version
        self.outcome: MatOutcome | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"dstl-materialize-{index}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> MatOutcome:
        """Wait for the upload; an outcome with an error if it did not finish in time."""
        self._thread.join(timeout_s)
        if self._thread.is_alive() or self.outcome is None:
            return MatOutcome(error=f"materialization did not finish in {timeout_s}s")
        return self.outcome

    def _dirty_key_groups(self) -> list[int]:
        plan = self.plan
        per_kg = (
            plan.committed.mat_per_kg()
            if plan.committed is not None
            else [(None, NO_BATCH)] * plan.max_parallelism
        )
        return sorted(
            kg
            for kg, b in self._reader.changed.items()
            if kg in self.kg_range and (plan.full_snapshot or b > per_kg[kg][1])
        )

    def _run(self) -> None:
        t0 = time.perf_counter()
        plan = self.plan
        dirty: list[int] = []
        uploaded: list[int] = []
        cleared: list[int] = []
        part: ChangelogHandle | None = None
        result: MatResult | None = None
        error = ""
        writer: ChangelogWriter | None = None
        try:
            dirty = self._dirty_key_groups()
            if dirty:
                writer = self.client.create_writer(
                    job_id=plan.job_id,
                    operator_id=f"{plan.operator_id}.mat",
                    key_group_range=self.kg_range.as_tuple(),
                )
                done = upload_snapshot(self._reader, writer, dirty, plan.persist_timeout_s)
                part = done.part
                uploaded, cleared = list(done.uploaded), list(done.cleared)
            result = MatResult(
                self.version, part, tuple(uploaded), tuple(cleared), plan.full_snapshot
            )
        except Exception as exc:  # reported to the driver, which counts failures
            error = f"{type(exc).__name__}: {exc}"
            log.warning("materialization of subtask %d failed: %s", self.index, error)
        finally:
            self._reader.close()
            if writer is not None:
                with contextlib.suppress(DstlError):
                    writer.close()
        self.outcome = MatOutcome(
            result=result,
            error=error,
            seconds=round(time.perf_counter() - t0, 4),
            bytes=0 if part is None else part.stored_bytes,
            kgs=len(uploaded),
            dirty_kgs=len(dirty),
        )
