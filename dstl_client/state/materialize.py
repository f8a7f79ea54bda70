"""Materialization: upload a snapshot of a subtask's committed state through the sidecar.

The key groups changed since their last recorded materialization (every key
group of the range in ``full_snapshot`` mode) are written as PUT changes
through a fresh DSTL writer and persisted; the resulting handle is the
*part*. Unchanged key groups are re-referenced by the driver, not uploaded.

It runs in the background, across batches: the task that starts it does not
wait (unless the plan's ``materialization_wait_s`` lets it), and whichever
later task of the subtask finds it ended reports its outcome through the
store's :class:`~dstl_client.state.mat_slot.MaterializationSlot`. A failure is
reported to the driver (which counts them), never raised.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from dstl_client.checkpoint.messages import (
    MAT_NOT_HERE,
    MAT_PROCESS_EXITED,
    BatchPlan,
    MatFailure,
    MatResult,
)
from dstl_client.checkpoint.records import NO_BATCH
from dstl_client.client import ChangelogClient, ChangelogWriter
from dstl_client.core.errors import DstlError
from dstl_client.core.handle import ChangelogHandle
from dstl_client.keygroups import KeyGroupRange
from dstl_client.state.mat_slot import (
    DONE,
    FAILED,
    RUNNING,
    MaterializationSlot,
    MatOutcome,
    SlotClaim,
    SlotRecord,
)
from dstl_client.state.snapshot_upload import upload_snapshot
from dstl_client.state.store import SnapshotReader

log = logging.getLogger(__name__)

__all__ = ["MatOutcome", "Materializer", "TaskMaterialization"]


class Materializer:
    """Uploads the snapshot of version ``version`` of one subtask's store, in a thread.

    Invariants: it reads only through its :class:`SnapshotReader`, a
    consistent view of the version fixed when the reader was opened (tasks go
    on writing later batches meanwhile); it closes the reader and its writer
    whatever happens; the slot says ``running`` before :meth:`start` returns,
    and the outcome is written to the slot *before* the slot's claim is
    released, so a task that finds the slot free finds the outcome (or a
    ``running`` record: the process died). :attr:`outcome` is set exactly
    once, by the upload thread.

    Threads: :meth:`start` and :meth:`join` on the task's thread; the upload
    on a daemon thread of its own, which outlives the task.
    """

    def __init__(
        self,
        plan: BatchPlan,
        index: int,
        kg_range: KeyGroupRange,
        client: ChangelogClient,
        reader: SnapshotReader,
        version: int,
        slot: MaterializationSlot,
        claim: SlotClaim,
    ) -> None:
        self.plan = plan
        self.index = index
        self.kg_range = kg_range
        self.client = client
        self._reader = reader
        self.version = version
        self._slot = slot
        self._claim = claim
        self.outcome: MatOutcome | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"dstl-materialize-{index}", daemon=True
        )

    def start(self) -> None:
        try:
            self._slot.write(SlotRecord(self.version, RUNNING, round_id=self.plan.mat_round_id))
            self._thread.start()
        except BaseException:
            self._reader.close()
            self._claim.release()
            raise

    def join(self, timeout_s: float) -> MatOutcome | None:
        """The outcome if the upload ended within ``timeout_s``, else ``None``."""
        self._thread.join(timeout_s)
        return None if self._thread.is_alive() else self.outcome

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
        uploaded: tuple[int, ...] = ()
        cleared: tuple[int, ...] = ()
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
                part, uploaded, cleared = done.part, done.uploaded, done.cleared
            result = MatResult(self.version, part, uploaded, cleared, plan.full_snapshot)
        except Exception as exc:  # reported to the driver, which counts failures
            error = f"{type(exc).__name__}: {exc}"
            log.warning("materialization of subtask %d failed: %s", self.index, error)
        finally:
            self._reader.close()
            if writer is not None:
                with contextlib.suppress(DstlError):
                    writer.close()
        outcome = MatOutcome(
            batch=self.version,
            result=result,
            error=error,
            failure=MatFailure.ERROR if error else None,
            seconds=round(time.perf_counter() - t0, 4),
            bytes=0 if part is None else part.stored_bytes,
            kgs=len(uploaded),
            dirty_kgs=len(dirty),
        )
        try:
            status = FAILED if error else DONE
            self._slot.write(SlotRecord(self.version, status, outcome, self.plan.mat_round_id))
        except OSError as exc:  # the next task finds "running" under a free lock: failed
            log.warning("materialization of subtask %d: outcome not saved: %s", self.index, exc)
        finally:
            self.outcome = outcome
            self._claim.release()


class TaskMaterialization:
    """The materialization side of one task attempt: start one, report how one ended.

    The driver runs one materialization *round* at a time: version ``C`` of
    every subtask (``plan.mat_round``), started by the tasks of the batch after
    ``C`` (``plan.materialize``). A task reports the round's outcome for its
    subtask once it has ended (done, failed, or gone because the process
    running it exited), and keeps a done outcome in the slot until the driver's
    record holds it (a batch that fails after reporting it reports it again).
    A slot holding anything but the round the driver waits for (another
    batch, or the same batch under another round id: an abandoned round, a
    driver restart) is obsolete and cleared; its objects are orphans for the
    sweep, which a new driver runs at its start.

    Invariants: at most one materialization per store at a time (the slot's
    claim); a round's outcome is reported, never lost silently: a subtask
    whose round cannot run or vanished reports an error, which the driver
    counts. Thread: the task's, while it holds the store's lock.
    """

    def __init__(
        self,
        plan: BatchPlan,
        index: int,
        kg_range: KeyGroupRange,
        client: ChangelogClient,
        slot: MaterializationSlot,
    ) -> None:
        self.plan = plan
        self.index = index
        self.kg_range = kg_range
        self.client = client
        self.slot = slot
        self.report: MatOutcome | None = None
        self._materializer: Materializer | None = None

    def _recorded(self, batch: int) -> bool:
        """Whether the driver's last record holds this range's materialization of ``batch``."""
        committed = self.plan.committed
        if committed is None:
            return False
        per_kg = committed.mat_per_kg()
        return all(per_kg[kg][1] >= batch for kg in self.kg_range)

    def _ours(self, record: SlotRecord) -> bool:
        """Whether the slot's record is of the round the plan names (batch and round id)."""
        return record.batch == self.plan.mat_round and record.round_id == self.plan.mat_round_id

    def at_open(self, store_version: int | None, open_reader: Callable[[], SnapshotReader]) -> None:
        """Report an ended round, or start the round if the plan asks and none runs."""
        self._poll(store_version, open_reader)

    def at_finish(self) -> None:
        """Report the round if it ended meanwhile (waiting up to ``materialization_wait_s``
        for one this attempt started)."""
        if self.report is not None:
            return
        if self._materializer is not None:
            wait = self.plan.materialization_wait_s
            if self._materializer.join(wait) is None:
                return  # still uploading: a later task reports it
        self._poll(None, None)

    def _poll(
        self, store_version: int | None, open_reader: Callable[[], SnapshotReader] | None
    ) -> None:
        plan = self.plan
        wanted = plan.mat_round
        claim = self.slot.claim()
        if claim is None:  # one runs
            record = self.slot.read()
            if plan.materialize and record is not None and not self._ours(record):
                self.report = MatOutcome(
                    batch=wanted,
                    error=f"the materialization of batch {record.batch} of another round "
                    "still runs in this store",
                    failure=MatFailure.BUSY,
                )
            return
        try:
            record = self.slot.read()
            if record is not None and (not self._ours(record) or self._recorded(record.batch)):
                self.slot.clear()  # obsolete, or the driver has it
                record = None
            if record is not None:
                if record.status == RUNNING or record.outcome is None:
                    self.report = MatOutcome(
                        batch=record.batch,
                        error=MAT_PROCESS_EXITED,
                        failure=MatFailure.PROCESS_EXITED,
                    )
                else:
                    self.report = record.outcome
                if self.report.error:
                    self.slot.clear()  # reported once; the driver plans another round
                return
            if wanted == NO_BATCH or self._recorded(wanted):
                return
            if plan.materialize and open_reader is not None and store_version == wanted:
                try:
                    reader = open_reader()
                except sqlite3.Error as exc:
                    self.report = _not_started(wanted, exc)
                    return
                materializer = Materializer(
                    plan, self.index, self.kg_range, self.client, reader, wanted, self.slot, claim
                )
                claim = None  # the materializer's now: released by it, whatever happens
                try:
                    materializer.start()
                except (OSError, RuntimeError) as exc:
                    self.report = _not_started(wanted, exc)
                    return
                self._materializer = materializer
                return
            self.report = MatOutcome(
                batch=wanted,
                error=f"{MAT_NOT_HERE} (batch {wanted}): it started on another node, "
                "or the store was rebuilt since",
                failure=MatFailure.NOT_HERE,
            )
        finally:
            if claim is not None:
                claim.release()


def _not_started(batch: int, exc: BaseException) -> MatOutcome:
    return MatOutcome(batch=batch, error=f"could not start: {exc}", failure=MatFailure.NOT_STARTED)
