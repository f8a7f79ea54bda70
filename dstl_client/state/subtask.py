"""One subtask of a keyed operator running one batch (engine-independent).

The driver sends every task a :class:`BatchPlan` (in Spark: the closure of
the batch's ``mapInArrow`` function). A task for subtask ``i``:

1. locks the node-local store of its key-group range and brings it to the
   last committed version ``C`` named in the plan: merges the pending batch
   if that batch is ``C`` (by the committed attempt id), drops it if it was
   not committed, or, when the store is missing, stale or of another range,
   **restores** it from the checkpoint record (materialized parts, then the
   changelog replayed in batch/SQN order, filtered to its key groups);
2. if the plan asks, **materializes**: uploads the rows of the key groups
   changed since their last materialization, through a fresh DSTL writer,
   as a snapshot of version ``C`` (unchanged key groups are re-referenced by
   the driver); failures are reported, not raised;
3. truncates its changelog writer below what materializations recorded by
   the driver cover;
4. runs the user function per key over a :class:`ChangelogStateBackend`,
   every change applied to the pending batch and appended to the DSTL;
5. persists the batch's changes durably, *then* commits the pending batch
   locally (version ``N``, its own attempt id), and reports a
   :class:`~dstl_client.coordinator.records.TaskResult`.

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

import contextlib
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstl_client.client import ChangelogClient, ChangelogWriter
from dstl_client.coordinator.records import NO_BATCH, CheckpointRecord, MatResult, TaskResult
from dstl_client.core.errors import (
    CallLost,
    ConfigError,
    CorruptObject,
    DstlError,
    LogNotFound,
    WriterFailed,
)
from dstl_client.core.format import split_changes
from dstl_client.keygroups import KeyGroupRange, key_group_range_for_operator
from dstl_client.state.api import KeyedContext
from dstl_client.state.backend import (
    DEFAULT_CACHE_ROWS,
    ChangelogStateBackend,
    KeyedStateBackend,
)
from dstl_client.state.changes import OP_PUT, decode_change, encode_put
from dstl_client.state.store import (
    NO_VERSION,
    LocalKeyedStore,
    SnapshotReader,
    remove_overlapping_stores,
    store_dir,
)

log = logging.getLogger(__name__)

#: environment variable naming the node's sidecar (``host:port`` or ``unix:///path``)
ADDRESS_ENV = "DSTL_ADDRESS"
#: environment variable with the sidecar's bearer token, if it wants one
TOKEN_ENV = "DSTL_TOKEN"
#: environment variable with a PEM CA bundle: the sidecar serves TLS (TCP off loopback)
CA_FILE_ENV = "DSTL_CA_FILE"
_MAT_APPEND_BATCH = 4096


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What the driver tells every task of one batch."""

    job_id: str
    operator_id: str
    batch_id: int
    parallelism: int
    max_parallelism: int
    state_dir: str
    #: the last committed checkpoint (``None`` before the first one)
    committed: CheckpointRecord | None
    #: sidecar address; a task prefers ``$DSTL_ADDRESS`` of its node
    dstl_address: str | None = None
    dstl_token: str | None = None
    materialize: bool = False
    #: baseline mode: materialize every key group, changed or not
    full_snapshot: bool = False
    persist_timeout_s: float = 120.0
    cache_rows: int = DEFAULT_CACHE_ROWS
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def committed_batch(self) -> int:
        return NO_BATCH if self.committed is None else self.committed.batch_id


_clients: dict[tuple[int, str, str | None, str | None], ChangelogClient] = {}
_clients_lock = threading.Lock()


def shared_client(address: str, token: str | None = None) -> ChangelogClient:
    """One client per process and sidecar (Python workers are reused across tasks)."""
    ca_file = os.environ.get(CA_FILE_ENV) or None
    key = (os.getpid(), address, token, ca_file)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            try:
                roots = Path(ca_file).read_bytes() if ca_file else None
            except OSError as exc:
                raise ConfigError(f"{CA_FILE_ENV}={ca_file!r}: cannot read: {exc}") from None
            client = ChangelogClient(address, token=token, root_certificates=roots)
            _clients[key] = client
        return client


def resolve_address(plan: BatchPlan) -> tuple[str, str | None]:
    """The sidecar of this node: ``$DSTL_ADDRESS``, else the plan's."""
    address = os.environ.get(ADDRESS_ENV) or plan.dstl_address
    if not address:
        raise ConfigError(
            f"no sidecar address: set {ADDRESS_ENV} on the executors or pass dstl_address"
        )
    token = os.environ.get(TOKEN_ENV) or plan.dstl_token
    return address, token


def restore_range(
    store: LocalKeyedStore,
    committed: CheckpointRecord,
    client: ChangelogClient,
    attempt: str = "",
) -> dict[str, int]:
    """Reset ``store`` and rebuild its key groups as of the ``committed`` checkpoint.

    Loads each key group's rows from its materialized part, then replays, in
    batch order, the changelog segments after that materialization, filtered
    to the store's key groups. Returns counts (rows, replayed changes, bytes).
    """
    store.reset()
    rng = store.kg_range
    per_kg = committed.mat_per_kg()
    changed: dict[int, int] = {}
    rows = 0
    read_bytes = 0
    for pid, handle in committed.parts.items():
        kgs = [kg for kg in rng if per_kg[kg][0] == pid]
        if not kgs:
            continue
        batch: list[tuple[int, bytes, bytes | None]] = []
        for view in client.read_changesets(handle, kgs):
            kg = view.key_group
            read_bytes += len(view.payload)
            for data in split_changes(view.count, view.sizes, view.payload):
                op, k, v = decode_change(data)
                if op != OP_PUT:
                    raise CorruptObject(f"materialized part {pid} holds a change of type {op}")
                batch.append((kg, k, v))
            rows += view.count
            if len(batch) >= 10_000:
                store.write_main(batch)
                batch = []
        store.write_main(batch)
        for kg in kgs:
            changed[kg] = per_kg[kg][1]
    backend = KeyedStateBackend(store, committed.max_parallelism, target="main")
    replayed = 0
    for seg in sorted(committed.segments, key=lambda s: (s.batch, s.first)):
        inter = seg.kg_range.intersection(rng)
        if inter is None:
            continue
        kgs = [kg for kg in inter if per_kg[kg][1] < seg.batch]
        if not kgs:
            continue
        for kg, _sqn, data in client.read_changes(seg.handle, kgs):
            backend.apply_change(kg, data)
            changed[kg] = seg.batch
            replayed += 1
            read_bytes += len(data)
    backend.flush()
    store.begin()
    store.mark_changed(changed)
    store.set_meta(main_version=committed.batch_id, main_attempt=attempt or "restored")
    store.commit()
    return {"restore_rows": rows, "restore_replayed": replayed, "restore_bytes": read_bytes}


class Subtask:
    """One attempt of one subtask for one batch. Use as a context manager."""

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
        self.stats: dict[str, Any] = {"restored": False}
        self.mat: MatResult | None = None
        self.mat_error = ""
        self._store: LocalKeyedStore | None = None
        self._writer: ChangelogWriter | None = None
        self._backend: ChangelogStateBackend | None = None
        self.context: KeyedContext | None = None
        self.start_sqn = 0
        self._mat_thread: threading.Thread | None = None

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

    def open(self) -> KeyedContext:
        """Prepare the store (merge, drop or restore), materialize if asked, start logging."""
        plan = self.plan
        directory = store_dir(plan.state_dir, plan.job_id, plan.operator_id, self.kg_range)
        t0 = time.perf_counter()
        self._store = LocalKeyedStore(directory, self.kg_range)
        self.stats["lock_s"] = round(time.perf_counter() - t0, 4)
        self._prepare_version()
        if plan.materialize and self.store.main_version[0] != NO_VERSION:
            # the snapshot of version C is fixed now; it uploads while the batch runs
            reader = self.store.snapshot_reader()
            version = self.store.main_version[0]
            self._mat_thread = threading.Thread(
                target=self._materialize,
                args=(reader, version),
                name=f"dstl-materialize-{self.index}",
                daemon=True,
            )
            self._mat_thread.start()
        self._open_writer()
        self._truncate()
        assert self._writer is not None
        self._backend = ChangelogStateBackend(
            self.store, plan.max_parallelism, self._writer, cache_rows=plan.cache_rows
        )
        self.context = KeyedContext(self._backend, plan.batch_id)
        return self.context

    def _prepare_version(self) -> None:
        store = self.store
        committed = self.plan.committed
        delta = store.delta_version
        if committed is None:
            if store.main_version == (NO_VERSION, ""):
                store.drop_delta()
                return
            store.reset()
            self.stats["reset"] = True
            return
        sub = committed.subtask_for(self.kg_range)
        want = None if sub is None else (committed.batch_id, sub.attempt)
        if want is not None and delta == want:
            store.merge_delta()
        elif want is not None and store.main_version == want:
            store.drop_delta()
        else:
            self._restore(committed)

    def _restore(self, committed: CheckpointRecord) -> None:
        """Rebuild the range's state as of ``committed`` from the DSTL."""
        t0 = time.perf_counter()
        store = self.store
        sub = committed.subtask_for(self.kg_range)
        attempt = sub.attempt if sub is not None else f"restored-{self.attempt}"
        stats = restore_range(store, committed, self.client, attempt)
        for _path, log_id in remove_overlapping_stores(
            store.directory.parent, self.kg_range, store.directory
        ):
            if log_id:  # that range's changelog writer is no longer needed
                with contextlib.suppress(DstlError):
                    ChangelogWriter(self.client, self.plan.job_id, log_id, (0, 0), 1).close()
        self.stats.update(restored=True, restore_s=round(time.perf_counter() - t0, 4), **stats)
        log.info(
            "subtask %d %s restored to batch %d: %s",
            self.index,
            self.kg_range,
            committed.batch_id,
            stats,
        )

    def _materialize(self, reader: SnapshotReader, version: int) -> None:
        """Upload the key groups changed since their last materialization (a thread)."""
        t0 = time.perf_counter()
        plan = self.plan
        per_kg = (
            plan.committed.mat_per_kg()
            if plan.committed is not None
            else [(None, NO_BATCH)] * plan.max_parallelism
        )
        changed = reader.changed
        dirty = sorted(
            kg
            for kg, b in changed.items()
            if kg in self.kg_range and (plan.full_snapshot or b > per_kg[kg][1])
        )
        uploaded: list[int] = []
        cleared: list[int] = []
        part = None
        writer: ChangelogWriter | None = None
        try:
            if dirty:
                writer = self.client.create_writer(
                    job_id=plan.job_id,
                    operator_id=f"{plan.operator_id}.mat",
                    key_group_range=self.kg_range.as_tuple(),
                )
                pending: list[tuple[int, bytes]] = []
                for kg in dirty:
                    n = 0
                    for k, v in reader.rows_of_key_group(kg):
                        pending.append((kg, encode_put(k, v)))
                        n += 1
                        if len(pending) >= _MAT_APPEND_BATCH:
                            writer.append_many(pending)
                            pending = []
                    (uploaded if n else cleared).append(kg)
                if pending:
                    writer.append_many(pending)
                if uploaded:
                    part = writer.persist_durably(after=0).result(timeout=plan.persist_timeout_s)
            self.mat = MatResult(version, part, tuple(uploaded), tuple(cleared), plan.full_snapshot)
        except Exception as exc:  # reported to the driver, which counts failures
            self.mat_error = f"{type(exc).__name__}: {exc}"
            log.warning("materialization of subtask %d failed: %s", self.index, self.mat_error)
        finally:
            reader.close()
            if writer is not None:
                with contextlib.suppress(DstlError):
                    writer.close()
        self.stats.update(
            mat_s=round(time.perf_counter() - t0, 4),
            mat_bytes=0 if part is None else part.stored_bytes,
            mat_kgs=len(uploaded),
            mat_dirty_kgs=len(dirty),
        )

    def _open_writer(self) -> None:
        plan = self.plan
        store = self.store
        log_id = store.meta("log_id")
        if log_id:
            writer = ChangelogWriter(
                self.client,
                plan.job_id,
                log_id,
                self.kg_range.as_tuple(),
                int(store.meta("max_change_bytes", "0") or 0) or (4 << 20),
            )
            self._writer = writer  # a failure from here on abandons its log
            try:
                self.start_sqn = writer.last_appended_sqn()
                return
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
            truncated_before=0,
        )
        self._writer = writer
        self.start_sqn = writer.last_appended_sqn()
        self.stats["new_writer"] = True

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
        with contextlib.suppress(Exception):  # best effort: the error at hand matters
            writer.close()
        self.stats["abandoned_log"] = writer.log_id
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
            self.stats["truncated_before"] = before
        store.prune_segments(covered + 1)
        store.commit()

    # ------------------------------------------------------------- finish
    def finish(self) -> TaskResult:
        """Persist the batch's changes, then commit it locally; the task's result."""
        backend = self.backend
        writer = self._writer
        assert writer is not None
        t0 = time.perf_counter()
        backend.flush_log()
        handle = writer.persist_durably(after=self.start_sqn).result(
            timeout=self.plan.persist_timeout_s
        )
        t1 = time.perf_counter()
        self._join_materialization(self.plan.persist_timeout_s)
        t_mat = time.perf_counter() - t1
        store = self.store
        store.begin()
        backend.flush()
        store.add_segment(self.plan.batch_id, writer.log_id, self.start_sqn, handle.to_sqn)
        store.set_meta(delta_version=self.plan.batch_id, delta_attempt=self.attempt)
        store.commit()
        t2 = time.perf_counter()
        self.stats.update(
            changes=backend.changes,
            logged_bytes=backend.logged_bytes,
            persisted_bytes=handle.stored_bytes,
            persist_s=round(t1 - t0, 4),
            mat_wait_s=round(t_mat, 4),
            local_commit_s=round(t2 - t1 - t_mat, 4),
            state_bytes=store.size_bytes(),
            key_groups_touched=len(backend.touched),
        )
        return TaskResult(
            index=self.index,
            first=self.kg_range.first,
            last=self.kg_range.last,
            batch_id=self.plan.batch_id,
            attempt=self.attempt,
            changelog=None if handle.is_empty() else handle,
            mat=self.mat,
            mat_error=self.mat_error,
            stats=self.stats,
        )

    def _join_materialization(self, timeout_s: float) -> None:
        thread = self._mat_thread
        if thread is None:
            return
        thread.join(timeout_s)
        self._mat_thread = None
        if thread.is_alive():
            self.mat = None
            self.mat_error = f"materialization did not finish in {timeout_s}s"

    def close(self, error: BaseException | None = None) -> None:
        """Release the store (an unfinished batch is rolled back).

        ``error``: the exception the attempt fails with. If the writer failed,
        or the error is one of the DSTL's or a persist timeout (the outcome of
        the writer's calls is unknown), the writer's log is abandoned (see
        :meth:`_abandon_writer`); the exception goes on to fail the task.
        """
        writer = self._writer
        if (
            error is not None
            and writer is not None
            # TimeoutError: a persist did not finish in persist_timeout_s
            and (writer.failed is not None or isinstance(error, DstlError | TimeoutError))
        ):
            self._abandon_writer(error)
        self._join_materialization(self.plan.persist_timeout_s)
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Subtask:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close(exc)


KeyedFunction = Callable[[Any, list[Any], KeyedContext], Iterable[Any] | None]
"""``fn(key, rows, ctx)``: process one key's rows of a batch; returns output rows (or None)."""


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
        task.stats.update(rows=rows, keys=keys, open_s=round(t1 - t0, 4), apply_s=round(t2 - t1, 4))
        result = task.finish()
    result.stats["task_s"] = round(time.perf_counter() - t0, 4)
    return result
