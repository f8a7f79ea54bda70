"""One run of (a) and (b): SeaweedFS, a sidecar, the job, and the restores at each record."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dstl_client.checkpoint.records import CheckpointRecord
from loadtest.recovery_bench.config import BenchConfig
from loadtest.recovery_bench.dstl_job import JobFigures, run_dstl_job
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

    @property
    def label(self) -> str:
        if self.kind == "full":
            return f"full snapshot (state after {self.tail} updates)"
        return f"materialization + tail {self.tail}"


@dataclass(slots=True)
class DstlResult:
    job: JobFigures | None = None
    restores: list[RecordRestores] = field(default_factory=list)


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
            rr = RecordRestores(kind, tail, record.batch_id, len(record.segments), one, job)
            out.restores.append(rr)
            log(
                f"restore from {rr.label}: "
                + ", ".join(
                    f"p={p}: one {one[p].seconds:.2f}s, job {job[p].seconds:.2f}s"
                    for p in cfg.restore_parallelisms
                )
            )

        out.job = run_dstl_job(cfg, work / "job", sidecar.address, at_record, log)
    return out
