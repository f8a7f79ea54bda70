"""(a) and (b): the keyed job on the DSTL builds the state, checkpoint by checkpoint.

The job runs the product's batch cycle (:class:`CheckpointCoordinator` plans
and records each batch; each subtask runs
:func:`~dstl_client.state.subtask.run_keyed` in its own process, as Spark's
Python workers do), against a real ``dstl-server`` whose objects go to a real
S3 server:

1. load batches write every key (round 0);
2. an empty batch materializes the loaded state: its record is the state as
   a full snapshot and a changelog tail of 0 checkpoints;
3. update rounds 1..T, one batch each (``update_fraction`` of the keys): the
   record after round ``t`` has the materialization plus a tail of ``t``
   checkpoints — unless the job runs with a ``materialize_tail_ratio``
   (``tail_ratio`` > 0), whose coordinator starts materializations of its
   own as the tail outgrows that share of the state: then the record after
   round ``t`` replays only the checkpoints since the last of them, and the
   first record whose tail outgrew the ratio (the longest tail the ratio
   lets a restore replay) is handed over too, as kind ``"worst"``;
4. an empty batch materializes again: its record is a full snapshot of the
   same state as the record after round T (the baseline (b)).

At each of these records :func:`run_dstl_job` hands the record to the
caller's ``at_record`` (which restores from it) before the job goes on, so
every object the record names is still retained.

A materializing batch waits for its uploads (``materialization_wait_s``), so
a round started by the tail ratio lands in the record of the batch that
started it: the tails measured are the ratio's bound exactly (a job with the
default wait of 0 also replays the checkpoints taken while the upload runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from dstl_client.checkpoint.messages import BatchPlan, TaskResult
from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.coordinator.batches import tail_outgrew
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from loadtest.recovery_bench.config import BenchConfig
from loadtest.recovery_bench.workload import (
    key_name,
    put_value,
    subtask_of_ids,
    update_ids,
    value_of,
)

JOB_ID = "recovery-bench"
#: a materialization is planned only when the job asks for one
NEVER_S = 1e9


def run_task(plan: BatchPlan, index: int, ids: list[int], round_no: int, size: int) -> TaskResult:
    """One subtask of one batch (in a worker process): ``ids`` get their round's value."""
    groups = ((key_name(i), [value_of(i, round_no, size)]) for i in ids)
    return run_keyed_task(plan, index, groups)


def run_keyed_task(plan: BatchPlan, index: int, groups: object) -> TaskResult:
    from dstl_client.state.subtask import run_keyed

    return run_keyed(plan, index, groups, put_value)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Materialization:
    """One materialization batch: every subtask's upload. Frozen."""

    batch_id: int
    wall_s: float
    #: per subtask: seconds of its upload, bytes stored
    seconds: tuple[float, ...]
    bytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes)

    @property
    def node_mb_per_s(self) -> float:
        """Bytes of every subtask over the longest upload (they run at once, on one node)."""
        return self.total_bytes / max(max(self.seconds), 1e-9) / 1e6


@dataclass(frozen=True, slots=True)
class JobFigures:
    """What building the state cost. Frozen."""

    load_s: float
    update_s: float
    batches: int
    materializations: tuple[Materialization, ...]
    logged_bytes: int
    #: stored bytes the update rounds uploaded: their changelog, and the
    #: materializations the tail ratio started among them
    update_log_bytes: int = 0
    update_mat_bytes: int = 0
    update_mats: int = 0

    def upload_per_checkpoint(self, rounds: int) -> float:
        """Stored bytes uploaded per update checkpoint (changelog and materializations)."""
        return (self.update_log_bytes + self.update_mat_bytes) / max(rounds, 1)


AtRecord = Callable[[str, int, CheckpointRecord], None]
"""``at_record(kind, round, record)``: kind ``"tail"`` (the record after update
round ``round``), ``"worst"`` (the first whose tail outgrew the job's tail
ratio) or ``"full"`` (the state after the last round, as a full snapshot)."""


def run_dstl_job(
    cfg: BenchConfig,
    work: Path,
    address: str,
    at_record: AtRecord,
    log: Callable[[str], None] = print,
    *,
    tail_ratio: float = 0.0,
    job_id: str = JOB_ID,
) -> JobFigures:
    """Build the state on the DSTL (``tail_ratio``: the job's ``materialize_tail_ratio``)."""
    p = cfg.job_parallelism
    owner = subtask_of_ids(cfg.keys, p, cfg.max_parallelism)
    config = CoordinatorConfig(
        job_id=job_id,
        checkpoint_dir=str(work / "ckpt"),
        max_parallelism=cfg.max_parallelism,
        retain=2,
        materialize_interval_s=NEVER_S,
        state_dir=str(work / "state"),
        dstl_address=address,
        fsync=False,
        # a materializing batch waits for its uploads: the record after it holds the
        # materialization (tail 0), and the upload is timed inside the batch
        materialization_wait_s=600.0,
        materialize_tail_ratio=tail_ratio,
        materialize_tail_min_bytes=cfg.tail_min_bytes,
    )
    coord = CheckpointCoordinator(config)
    coord.start()
    batch = 0
    logged = 0
    updating = False  # the update rounds: their uploads are counted
    update_log = update_mat = update_mats = 0
    mats: list[Materialization] = []
    pool = ProcessPoolExecutor(max_workers=p, mp_context=get_context("spawn"))
    try:

        def run_batch(ids: list[int], round_no: int, materialize: bool = False) -> None:
            """One batch; ``materialize``: ask for a round (else only the tail ratio starts one)."""
            nonlocal batch, logged, update_log, update_mat, update_mats
            coord.set_materialize_interval(0.0 if materialize else NEVER_S)
            plan = coord.plan_batch(batch, p)
            if plan is None or plan.materialize < materialize:
                raise RuntimeError(f"batch {batch}: unexpected plan {plan}")
            if plan.materialize and not materialize and tail_ratio <= 0:
                raise RuntimeError(f"batch {batch}: a materialization nobody asked for")
            per = [[i for i in ids if owner[i] == s] for s in range(p)] if ids else [[]] * p
            t0 = time.perf_counter()
            futures = [
                pool.submit(run_task, plan, s, per[s], round_no, cfg.value_bytes) for s in range(p)
            ]
            results = [f.result() for f in futures]
            wall = time.perf_counter() - t0
            errors = [r.mat_error for r in results if r.mat_error]
            if errors:
                raise RuntimeError(f"materialization of batch {batch} failed: {errors[0]}")
            coord.complete_batch(plan, results)
            logged += sum(r.stats.logged_bytes for r in results)
            if updating:
                update_log += sum(r.changelog.stored_bytes for r in results if r.changelog)
                update_mat += sum(r.stats.mat_bytes for r in results)
                update_mats += plan.materialize
            if plan.materialize:
                mats.append(
                    Materialization(
                        batch,
                        wall,
                        tuple(r.stats.mat_s for r in results),
                        tuple(r.stats.mat_bytes for r in results),
                    )
                )
            batch += 1

        def latest() -> CheckpointRecord:
            rec = coord.latest
            assert rec is not None
            return rec

        t0 = time.perf_counter()
        for first in range(0, cfg.keys, cfg.load_batch_keys):
            run_batch(list(range(first, min(cfg.keys, first + cfg.load_batch_keys))), 0)
        run_batch([], 0, materialize=True)
        load_s = time.perf_counter() - t0
        m = mats[-1]
        log(
            f"dstl job: {cfg.keys:,} keys loaded and materialized in {load_s:.1f}s "
            f"({m.total_bytes / 1e6:.1f} MB in {max(m.seconds):.2f}s, "
            f"{m.node_mb_per_s:.1f} MB/s)"
        )
        if 0 in cfg.tails:
            at_record("tail", 0, latest())
        t1 = time.perf_counter()
        updating, worst_seen = True, False
        for r in range(1, cfg.max_tail + 1):
            run_batch(update_ids(cfg.keys, cfg.update_fraction, r, cfg.seed), r)
            if r in cfg.tails:
                log(f"dstl job: {r} update checkpoints since the materialization")
                at_record("tail", r, latest())
            if not worst_seen and tail_outgrew(latest(), tail_ratio, cfg.tail_min_bytes):
                worst_seen = True
                log(f"dstl job: the tail after round {r} outgrew {tail_ratio:g} of the state")
                at_record("worst", r, latest())
        updating = False
        update_s = time.perf_counter() - t1
        run_batch([], cfg.max_tail, materialize=True)
        m = mats[-1]
        log(
            f"dstl job: state after round {cfg.max_tail} materialized "
            f"({m.total_bytes / 1e6:.1f} MB in {max(m.seconds):.2f}s, "
            f"{m.node_mb_per_s:.1f} MB/s)"
        )
        at_record("full", cfg.max_tail, latest())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        coord.close_writers()
        coord.close()
    return JobFigures(
        load_s, update_s, batch, tuple(mats), logged, update_log, update_mat, update_mats
    )
