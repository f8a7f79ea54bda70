"""One run of (a) and (b): SeaweedFS, a sidecar, the job, and the restores at each record;
then the sweep: one more job per ``materialize_tail_ratio``, restored at the goal's tails,
at its longest tail and as a full snapshot (the curve the ratio's default is chosen from)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dstl_client.checkpoint.records import CheckpointRecord
from dstl_client.coordinator.batches import tail_share
from loadtest.recovery_bench.config import BenchConfig
from loadtest.recovery_bench.dstl_job import JOB_ID, JobFigures, run_dstl_job
from loadtest.recovery_bench.restorer import JobRestore, restore_subtasks


@dataclass(frozen=True, slots=True)
class RecordRestores:
    """Restores from one checkpoint record. Frozen."""

    kind: str  # "tail": materialization + changelog tail; "full": a full snapshot
    tail: int
    batch_id: int
    segments: int
    #: parallelism -> the restore of subtask 0 alone
    one: dict[int, JobRestore]
    #: parallelism -> the restore of every subtask at once (best of ``repeat``)
    job: dict[int, JobRestore]
    #: the tail's stored bytes over the materialized parts' (:func:`tail_share`)
    share: float = 0.0

    @property
    def label(self) -> str:
        if self.kind == "full":
            return f"full snapshot (state after {self.tail} updates)"
        return f"materialization + tail {self.tail}"


@dataclass(frozen=True, slots=True)
class RatioRestore:
    """One restore of a sweep job: whole job at the goal's parallelism, best of ``repeat``."""

    #: the update round after which the record was written
    round: int
    #: the record's changelog tail: segments, and stored bytes over the parts' (tail_share)
    segments: int
    share: float
    seconds: float


@dataclass(frozen=True, slots=True)
class RatioPoint:
    """One job of the sweep, run with ``materialize_tail_ratio`` = ``ratio``. Frozen."""

    ratio: float
    #: update round -> the restore from the record after it (the goal's tails)
    at: dict[int, RatioRestore]
    #: the longest tail the ratio let a restore replay (the round it outgrew the ratio)
    worst: RatioRestore | None
    #: the state after the last round as a full snapshot: the reference
    full_s: float
    job: JobFigures


@dataclass(slots=True)
class DstlResult:
    job: JobFigures | None = None
    restores: list[RecordRestores] = field(default_factory=list)
    sweep: list[RatioPoint] = field(default_factory=list)


def run_dstl(cfg: BenchConfig, work: Path, log: Callable[[str], None] = print) -> DstlResult:
    """Start SeaweedFS and a sidecar on loopback, run the job, restore at each record."""
    from dstl_server.testing import ServerProcess
    from dstl_server.testing_s3 import SeaweedS3

    out = DstlResult()
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(SeaweedS3())
        sidecar = ServerProcess(
            work / "sidecar",
            storage=s3.storage_url("recovery"),
            extra_args=[
                *s3.server_args(),
                *(
                    ()
                    if cfg.read_cache_bytes is None
                    else ("--read-cache-bytes", str(cfg.read_cache_bytes))
                ),
            ],
            env=s3.env(),
        )
        stack.enter_context(sidecar)
        log(f"SeaweedFS at {s3.endpoint_url}, dstl-server at {sidecar.address}")
        n = 0

        def at_record(kind: str, tail: int, record: CheckpointRecord) -> None:
            nonlocal n
            n += 1
            one: dict[int, JobRestore] = {}
            job: dict[int, JobRestore] = {}
            for p in cfg.restore_parallelisms:
                d = work / f"restore-{n}-p{p}-one"
                one[p] = restore_subtasks(record, sidecar.address, p, [0], d)
                shutil.rmtree(d / "state", ignore_errors=True)
                for k in range(cfg.repeat):
                    d = work / f"restore-{n}-p{p}-job{k}"
                    r = restore_subtasks(record, sidecar.address, p, list(range(p)), d)
                    shutil.rmtree(d / "state", ignore_errors=True)
                    if p not in job or r.seconds < job[p].seconds:
                        job[p] = r
            rr = RecordRestores(
                kind, tail, record.batch_id, len(record.segments), one, job, tail_share(record)
            )
            out.restores.append(rr)
            log(
                f"restore from {rr.label}: "
                + ", ".join(
                    f"p={p}: one {one[p].seconds:.2f}s, job {job[p].seconds:.2f}s"
                    for p in cfg.restore_parallelisms
                )
            )

        out.job = run_dstl_job(cfg, work / "job", sidecar.address, at_record, log)
        for ratio in cfg.sweep:
            out.sweep.append(run_ratio(cfg, ratio, work / f"ratio-{ratio:g}", sidecar.address, log))
    return out


def goal_parallelism(cfg: BenchConfig) -> int:
    """The parallelism the goals are judged at: the job's own."""
    ps = cfg.restore_parallelisms
    return cfg.job_parallelism if cfg.job_parallelism in ps else ps[0]


def run_ratio(
    cfg: BenchConfig, ratio: float, work: Path, address: str, log: Callable[[str], None]
) -> RatioPoint:
    """The job once more with ``materialize_tail_ratio`` = ``ratio``, and its restores."""
    p = goal_parallelism(cfg)
    seen: dict[int, RatioRestore] = {}  # by batch id: a record restored once
    at: dict[int, RatioRestore] = {}
    worst: list[RatioRestore] = []
    full: list[float] = []

    def restore(round_no: int, record: CheckpointRecord) -> RatioRestore:
        if record.batch_id not in seen:
            best = float("inf")
            for k in range(cfg.repeat):
                d = work / f"restore-{record.batch_id}-{k}"
                best = min(best, restore_subtasks(record, address, p, list(range(p)), d).seconds)
                shutil.rmtree(d / "state", ignore_errors=True)
            share = tail_share(record)
            seen[record.batch_id] = RatioRestore(round_no, len(record.segments), share, best)
        return seen[record.batch_id]

    def at_record(kind: str, round_no: int, record: CheckpointRecord) -> None:
        r = restore(round_no, record)
        if kind == "full":
            full.append(r.seconds)
        elif kind == "worst":
            worst.append(r)
        elif round_no > 0:
            at[round_no] = r

    job_id = f"{JOB_ID}-r{ratio:g}".replace(".", "-")
    job = run_dstl_job(cfg, work, address, at_record, log, tail_ratio=ratio, job_id=job_id)
    point = RatioPoint(ratio, at, worst[0] if worst else None, full[0], job)
    log(
        f"tail ratio {ratio:g}: {job.update_mats} materializations in {cfg.max_tail} rounds, "
        f"{job.upload_per_checkpoint(cfg.max_tail) / 1e6:.2f} MB uploaded per checkpoint; "
        + ", ".join(f"round {t}: {r.seconds / point.full_s:.2f}x" for t, r in sorted(at.items()))
        + (
            f", longest tail (round {point.worst.round}, {point.worst.share:.2f} of the state):"
            f" {point.worst.seconds / point.full_s:.2f}x full"
            if point.worst
            else ""
        )
    )
    return point
