"""One subtask of a keyed operator running one batch: the task's lifecycle.

The driver sends every task a :class:`~dstl_client.checkpoint.messages.BatchPlan`
(in Spark: the closure of the batch's ``mapInArrow`` function). A task for
subtask ``i``:

1. locks the node-local store of its key-group range and brings it to the
   last committed version ``C`` named in the plan: merges the pending batch
   if that batch is ``C`` (by the committed attempt id), drops it if it was
   not committed, or, when the store is missing, stale or of another range,
   **restores** it from the checkpoint record (:mod:`.restore`);
2. if the plan asks, starts the **materialization** of version ``C`` in the
   background (:mod:`.materialize`): it runs across batches, never holding
   this one; the task reports a materialization that ended (this attempt's or
   an earlier task's, through the store's slot); failures are reported, not raised;
3. truncates its changelog writer below what materializations recorded by
   the driver cover;
4. runs the user function per key over a :class:`ChangelogStateBackend`,
   every change applied to the pending batch and appended to the DSTL;
5. persists the batch's changes durably, *then* commits the pending batch
   locally (version ``N``, its own attempt id), and reports a
   :class:`~dstl_client.checkpoint.messages.TaskResult`.

A retried attempt of the same batch finds the pending batch of the failed
attempt (other attempt id) and drops it: changes are never applied twice,
and its changelog handle starts at its own SQN, so the failed attempt's
changes are in no checkpoint either.

An attempt whose changelog writer fails (a send of changes failed, see
:class:`~dstl_client.client.ChangelogWriter`; or any DSTL error, whose
outcome may be unknown) fails with that error, so the engine retries the
task; on its way out it abandons the writer's log (the store forgets the log
id, the sidecar closes it). The retried attempt brings the store to the last
committed checkpoint and starts a new log, as after a sidecar restart.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.checkpoint.records import NO_BATCH
from dstl_client.checkpoint.stats import TaskStats
from dstl_client.client import ChangelogClient, ChangelogWriter
from dstl_client.core.errors import CallLost, DstlError, LogNotFound, WriterFailed
from dstl_client.keygroups import KeyGroupRange, key_group_range_for_operator
from dstl_client.state.api import KeyedContext
from dstl_client.state.backend import ChangelogStateBackend
from dstl_client.state.clients import resolve_address, resolve_state_dir, shared_client
from dstl_client.state.mat_slot import MaterializationSlot, MatOutcome
from dstl_client.state.materialize import TaskMaterialization
from dstl_client.state.operator_state import OperatorStates
from dstl_client.state.restore import restore_subtask
from dstl_client.state.store import NO_VERSION, LocalKeyedStore
from dstl_client.state.store_dirs import store_dir
from dstl_client.state.subtask_status import SubtaskStatus, SubtaskSteps, step

log = logging.getLogger(__name__)

KeyedFunction = Callable[[Any, list[Any], KeyedContext], Iterable[Any] | None]
"""``fn(key, rows, ctx)``: process one key's rows of a batch; returns output rows (or None)."""


class Subtask:
    """One attempt of one subtask for one batch. Use as a context manager.

    Invariants: the store is locked from :meth:`open` to :meth:`close`; the
    batch is committed locally only after its changes are durable at the
    sidecar; a writer that failed, or whose calls' outcome is unknown, is
    never used again (its log is abandoned on close); ``steps.status`` says
    where the attempt is (:mod:`.subtask_status`). Thread: the task's
    thread only (a materialization uploads on its own thread, which may
    outlive the task, see :class:`~dstl_client.state.materialize.Materializer`).
    """

    def __init__(self, plan: BatchPlan, index: int, client: ChangelogClient | None = None) -> None:
        self.plan = plan
        self.index = index
        self.kg_range: KeyGroupRange = key_group_range_for_operator(
            index, plan.parallelism, plan.max_parallelism
        )
        self.attempt = uuid.uuid4().hex
        if client is None:
            address, token = resolve_address(plan)
            client = shared_client(address, token)
        self.client = client
        self.stats = TaskStats()
        self._store: LocalKeyedStore | None = None
        self._writer: ChangelogWriter | None = None
        self._backend: ChangelogStateBackend | None = None
        self._mat: TaskMaterialization | None = None
        self.context: KeyedContext | None = None
        self._operator_states: OperatorStates | None = None
        self.start_sqn = 0
        self.steps = SubtaskSteps()

    # --------------------------------------------------------------- open
    @property
    def store(self) -> LocalKeyedStore:
        if self._store is None:
            raise RuntimeError("subtask is not open")
        return self._store

    @property
    def backend(self) -> ChangelogStateBackend:
        if self._backend is None:
            raise RuntimeError("subtask is not open")
        return self._backend

    @step("open", SubtaskStatus.NEW, SubtaskStatus.OPEN)
    def open(self) -> KeyedContext:
        """Prepare the store (merge, drop or restore), materialize if asked, start logging."""
        plan = self.plan
        directory = store_dir(resolve_state_dir(plan), plan.job_id, plan.operator_id, self.kg_range)
        t0 = time.perf_counter()
        self._store = LocalKeyedStore(directory, self.kg_range)
        self.stats = replace(self.stats, lock_s=round(time.perf_counter() - t0, 4))
        self._prepare_version()
        version = self.store.main_version[0]
        # a snapshot of version C is fixed when started; it uploads while batches run
        self._mat = TaskMaterialization(
            plan, self.index, self.kg_range, self.client, MaterializationSlot(directory)
        )
        self._mat.at_open(version if version != NO_VERSION else None, self.store.snapshot_reader)
        writer = self._open_writer()
        self._truncate()
        self._backend = ChangelogStateBackend(
            self.store, plan.max_parallelism, writer, cache_rows=plan.cache_rows
        )
        self._operator_states = OperatorStates(plan, self.index, self.kg_range, self.client)
        self.context = KeyedContext(self._backend, plan.batch_id, self._operator_states)
        return self.context

    def _prepare_version(self) -> None:
        store = self.store
        committed = self.plan.committed
        if committed is None:
            if store.main_version == (NO_VERSION, ""):
                store.drop_delta()
                return
            store.reset()
            self.stats = replace(self.stats, reset=True)
            return
        sub = committed.subtask_for(self.kg_range)
        want = None if sub is None else (committed.batch_id, sub.attempt)
        if want is not None and store.delta_version == want:
            store.merge_delta()
        elif want is not None and store.main_version == want:
            store.drop_delta()
        else:
            t0 = time.perf_counter()
            attempt = sub.attempt if sub is not None else f"restored-{self.attempt}"
            counts = restore_subtask(
                store, committed, self.client, job_id=self.plan.job_id, attempt=attempt
            )
            self.stats = replace(
                self.stats,
                restored=True,
                restore_s=round(time.perf_counter() - t0, 4),
                restore_rows=counts.rows,
                restore_replayed=counts.replayed,
                restore_bytes=counts.bytes,
            )

    def _open_writer(self) -> ChangelogWriter:
        """The range's changelog writer: the store's log if the sidecar has it, else a new one."""
        plan = self.plan
        store = self.store
        log_id = store.meta("log_id")
        if log_id:
            writer = self.client.open_writer(
                job_id=plan.job_id,
                log_id=log_id,
                key_group_range=self.kg_range.as_tuple(),
                max_change_bytes=int(store.meta("max_change_bytes", "0") or 0) or (4 << 20),
                packed=store.meta("packed", "1") == "1",
            )
            self._writer = writer  # a failure from here on abandons its log
            try:
                self.start_sqn = writer.last_appended_sqn()
                return writer
            except (LogNotFound, CallLost, WriterFailed) as exc:
                # the sidecar restarted, or the log's calls are out of step: a new log
                self._abandon_writer(exc)
        writer = self.client.create_writer(
            job_id=plan.job_id,
            operator_id=plan.operator_id,
            key_group_range=self.kg_range.as_tuple(),
        )
        store.set_meta(
            log_id=writer.log_id,
            max_change_bytes=writer.max_change_bytes,
            packed=int(writer.packed),
            truncated_before=0,
        )
        self._writer = writer
        self.start_sqn = writer.last_appended_sqn()
        self.stats = replace(self.stats, new_writer=True)
        return writer

    def _abandon_writer(self, error: BaseException) -> None:
        """Stop using the writer's log: the next attempt creates a new one.

        For a writer that failed (a send of changes failed, see
        :class:`~dstl_client.client.ChangelogWriter`) or whose state is
        unknown after an error: its log may lack changes this attempt
        appended, so no later attempt may reopen it. The attempt's pending
        batch is rolled back; the next attempt brings the store to the last
        committed checkpoint and starts a new log, as after a sidecar restart.
        The old log is closed (best effort); its persisted handles stay readable.
        """
        writer, self._writer = self._writer, None
        if writer is None:
            return
        store = self._store
        if store is not None and store.meta("log_id") == writer.log_id:
            try:
                store.rollback()  # the unfinished batch
                store.set_meta(log_id="", truncated_before=0)  # committed at once
            except sqlite3.Error as exc:  # the next attempt reopens the log (new session)
                log.warning(
                    "subtask %d could not forget log %s: %s", self.index, writer.log_id, exc
                )
        try:  # best effort: the error at hand matters
            writer.close()
        except Exception as exc:
            log.debug("closing abandoned log %s: %s", writer.log_id, exc)
        self.stats = replace(self.stats, abandoned_log=writer.log_id)
        log.warning(
            "subtask %d %s abandons changelog %s after %s: %s",
            self.index,
            self.kg_range,
            writer.log_id,
            type(error).__name__,
            error,
        )

    def _truncate(self) -> None:
        """Release changes every recorded materialization of this range covers."""
        committed = self.plan.committed
        if committed is None or self._writer is None:
            return
        per_kg = committed.mat_per_kg()
        covered = min(per_kg[kg][1] for kg in self.kg_range)
        if covered == NO_BATCH:
            return
        store = self.store
        before = self.start_sqn
        for batch, log_id, start, _end in store.segments():
            if batch > covered and log_id == self._writer.log_id:
                before = start
                break
        if before > int(store.meta("truncated_before", "0") or 0):
            self._writer.truncate(before)
            store.set_meta(truncated_before=before)
            self.stats = replace(self.stats, truncated_before=before)
        store.prune_segments(covered + 1)
        store.commit()

    # ------------------------------------------------------------- finish
    @step("finish", SubtaskStatus.OPEN, SubtaskStatus.COMMITTED)
    def finish(self) -> TaskResult:
        """Persist the batch's changes, then commit it locally; the task's result."""
        backend = self.backend
        writer = self._writer
        assert writer is not None
        plan = self.plan
        t0 = time.perf_counter()
        backend.flush_log()
        handle = writer.persist_durably(after=self.start_sqn).result(timeout=plan.persist_timeout_s)
        self.steps.reached(SubtaskStatus.PERSISTED)
        op_state = (
            None if self._operator_states is None else self._operator_states.write_if_needed()
        )
        t1 = time.perf_counter()
        mat = self._materialization_report()
        t_mat = time.perf_counter() - t1
        store = self.store
        store.begin()
        backend.flush()
        store.add_segment(plan.batch_id, writer.log_id, self.start_sqn, handle.to_sqn)
        store.set_meta(delta_version=plan.batch_id, delta_attempt=self.attempt)
        store.commit()
        t2 = time.perf_counter()
        self.stats = replace(
            self.stats,
            changes=backend.changes,
            logged_bytes=backend.logged_bytes,
            persisted_bytes=handle.stored_bytes,
            persist_s=round(t1 - t0, 4),
            mat_wait_s=round(t_mat, 4),
            local_commit_s=round(t2 - t1 - t_mat, 4),
            state_bytes=store.size_bytes(),
            key_groups_touched=len(backend.touched),
            mat_s=mat.seconds,
            mat_bytes=mat.bytes,
            mat_kgs=mat.kgs,
            mat_dirty_kgs=mat.dirty_kgs,
        )
        return TaskResult(
            index=self.index,
            first=self.kg_range.first,
            last=self.kg_range.last,
            batch_id=plan.batch_id,
            attempt=self.attempt,
            changelog=None if handle.is_empty() else handle,
            mat=mat.result,
            mat_error=mat.error,
            mat_failure=mat.failure,
            mat_batch=mat.batch,
            stats=self.stats,
            log_id=writer.log_id,
            op_state=op_state,
        )

    def _materialization_report(self) -> MatOutcome:
        """The outcome of a materialization that ended, to report (empty: none ended)."""
        mat = self._mat
        if mat is None:
            return MatOutcome()
        mat.at_finish()
        return mat.report or MatOutcome()

    def close(self, error: BaseException | None = None) -> None:
        """Release the store (an unfinished batch is rolled back).

        ``error``: the exception the attempt fails with. If the writer failed,
        or the error is one of the DSTL's or a persist timeout (the outcome of
        the writer's calls is unknown), the writer's log is abandoned (see
        :meth:`_abandon_writer`); the exception goes on to fail the task.
        """
        writer = self._writer
        if error is not None:
            self.steps.fail()
        if (
            error is not None
            and writer is not None
            # TimeoutError: a persist did not finish in persist_timeout_s
            and (writer.failed is not None or isinstance(error, DstlError | TimeoutError))
        ):
            self._abandon_writer(error)
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Subtask:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close(exc)


def run_keyed(
    plan: BatchPlan,
    index: int,
    groups: Iterable[tuple[Any, list[Any]]],
    fn: KeyedFunction,
    *,
    emit: Callable[[Any], None] | None = None,
    client: ChangelogClient | None = None,
) -> TaskResult:
    """Run one subtask of one batch: ``fn`` once per ``(key, rows)`` group.

    Every output row of ``fn`` goes to ``emit``. Returns the task's result once
    its changes are durable and the batch is committed locally.
    """
    t0 = time.perf_counter()
    with Subtask(plan, index, client) as task:
        ctx = task.open()
        backend = task.backend
        t1 = time.perf_counter()
        rows = 0
        keys = 0
        for key, key_rows in groups:
            backend.set_current_key(key)
            keys += 1
            rows += len(key_rows)
            out = fn(key, key_rows, ctx)
            if out is not None:
                if emit is None:
                    for _ in out:
                        pass
                else:
                    for item in out:
                        emit(item)
        t2 = time.perf_counter()
        task.stats = replace(
            task.stats, rows=rows, keys=keys, open_s=round(t1 - t0, 4), apply_s=round(t2 - t1, 4)
        )
        result = task.finish()
    return replace(result, stats=replace(result.stats, task_s=round(time.perf_counter() - t0, 4)))
