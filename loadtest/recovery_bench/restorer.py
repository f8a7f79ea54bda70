"""Restoring subtasks as a job does: one process per subtask, started together.

:func:`restore_subtasks` starts one worker process per subtask index
(``python -m loadtest.recovery_bench.restorer``), waits until each has
imported everything, opened its client and read the checkpoint record, then
tells them all to go at once. Each worker runs the product's restore,
:func:`dstl_client.state.restore.restore_subtask` (what
:class:`~dstl_client.state.subtask.Subtask` runs when its store is not at the
committed version) into a fresh store directory, and reports its figures as
one JSON line. The job's restore time is from the first worker's start to the
last worker's end: the time a job's tasks need before processing resumes.

Every worker is stopped (killed) when the parent gives up, also on errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dstl_client.checkpoint.records import CheckpointRecord

#: a file holding another version of ``dstl_client/state/restore.py`` to measure instead
#: (before/after figures: ``git show REV:dstl_client/state/restore.py > FILE``)
IMPL_ENV = "RECOVERY_BENCH_RESTORE_IMPL"
#: set: each worker profiles its restore (cProfile) into ``restorer-<index>.prof`` in its
#: work directory (``python -m pstats``; where a restore's time goes)
PROFILE_ENV = "RECOVERY_BENCH_PROFILE"
#: how long a worker may take to start, and to restore
START_TIMEOUT_S = 60.0
RESTORE_TIMEOUT_S = 3600.0


@dataclass(frozen=True, slots=True)
class SubtaskRestore:
    """One subtask's restore, as its worker measured it. Frozen."""

    index: int
    start: float
    end: float
    rows: int
    replayed: int
    bytes: int
    cpu_s: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class JobRestore:
    """The restore of some subtasks of one parallelism, started together. Frozen."""

    parallelism: int
    subtasks: tuple[SubtaskRestore, ...]

    @property
    def seconds(self) -> float:
        return max(s.end for s in self.subtasks) - min(s.start for s in self.subtasks)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.subtasks)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.subtasks)

    @property
    def replayed(self) -> int:
        return sum(s.replayed for s in self.subtasks)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / max(self.seconds, 1e-9) / 1e6


def restore_subtasks(
    record: CheckpointRecord,
    address: str,
    parallelism: int,
    indices: list[int],
    work: Path,
) -> JobRestore:
    """Restore subtasks ``indices`` of ``parallelism`` from ``record``, concurrently."""
    work.mkdir(parents=True, exist_ok=True)
    record_path = work / "record.json"
    record_path.write_bytes(record.to_bytes())
    procs: list[subprocess.Popen[str]] = []
    try:
        for i in indices:
            args = {
                "address": address,
                "record": str(record_path),
                "parallelism": parallelism,
                "index": i,
                "state_dir": str(work / "state"),
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "loadtest.recovery_bench.restorer", json.dumps(args)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=(work / f"restorer-{i}.stderr").open("w"),
                    text=True,
                )
            )
        for p in procs:
            _expect_line(p, "READY", START_TIMEOUT_S, work)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("GO\n")
            p.stdin.flush()
        results = []
        for p in procs:
            line = _expect_line(p, "{", RESTORE_TIMEOUT_S, work)
            doc = json.loads(line)
            results.append(SubtaskRestore(**doc))
            p.wait(timeout=30)
        return JobRestore(parallelism, tuple(sorted(results, key=lambda r: r.index)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


def _expect_line(p: subprocess.Popen[str], prefix: str, timeout_s: float, work: Path) -> str:
    """The worker's next stdout line, which must start with ``prefix``."""
    import selectors

    assert p.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise RuntimeError(f"restorer gave no {prefix!r} line in {timeout_s}s")
    line = p.stdout.readline()
    if not line.startswith(prefix):
        errors = "\n".join(f.read_text()[-2000:] for f in work.glob("restorer-*.stderr"))
        raise RuntimeError(f"restorer said {line!r} instead of {prefix!r}:\n{errors}")
    return line


def _worker(args: dict[str, object]) -> None:
    from dstl_client.client import ChangelogClient
    from dstl_client.keygroups import key_group_range_for_operator
    from dstl_client.state.restore import restore_subtask

    other = os.environ.get(IMPL_ENV)
    if other:  # another implementation of the module, for before/after figures
        import importlib.util

        spec = importlib.util.spec_from_file_location("restore_under_test", other)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        restore_subtask = module.restore_subtask
    from dstl_client.state.store import LocalKeyedStore
    from dstl_client.state.store_dirs import store_dir

    record = CheckpointRecord.from_bytes(Path(str(args["record"])).read_bytes())
    parallelism, index = int(str(args["parallelism"])), int(str(args["index"]))
    rng = key_group_range_for_operator(index, parallelism, record.max_parallelism)
    client = ChangelogClient(str(args["address"]))
    try:
        client.wait_ready(30.0)
        print("READY", flush=True)
        if sys.stdin.readline().strip() != "GO":
            return
        cpu0 = _cpu_s()
        start = time.time()
        directory = store_dir(str(args["state_dir"]), record.job_id, record.operator_id, rng)
        profile = None
        if os.environ.get(PROFILE_ENV):
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        with LocalKeyedStore(directory, rng) as store:
            counts = restore_subtask(
                store, record, client, job_id=record.job_id, attempt="recovery-bench"
            )
        end = time.time()
        if profile is not None:
            profile.disable()
            profile.dump_stats(str(Path(str(args["state_dir"])).parent / f"restorer-{index}.prof"))
        doc = {
            "index": index,
            "start": start,
            "end": end,
            "rows": counts.rows,
            "replayed": counts.replayed,
            "bytes": counts.bytes,
            "cpu_s": round(_cpu_s() - cpu0, 3),
        }
        print(json.dumps(doc), flush=True)
    finally:
        client.close()


def _cpu_s() -> float:
    """CPU seconds of this process, every thread."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


if __name__ == "__main__":
    os.environ.pop("DSTL_ADDRESS", None)
    _worker(json.loads(sys.argv[1]))
