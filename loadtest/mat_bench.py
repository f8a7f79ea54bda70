"""Materialization throughput through one node (``make bench-mat``).

``python -m loadtest.mat_bench``: SeaweedFS and one ``dstl-server`` on
loopback; ``--subtasks`` local stores (SQLite, as a subtask's) of ``--keys``
rows each; every round, each subtask's process uploads its whole store at
once through :func:`~dstl_client.state.snapshot_upload.upload_snapshot` (what
a materialization does: one writer, the key groups' rows as PUT changes, one
persist), all subtasks at the same time, as on one node.

Printed per round: stored MB, the longest subtask's upload, node MB/s
(stored bytes of every subtask over the longest upload, as
``make bench-recovery`` counts them), CPU seconds per stored MB of the
subtasks' processes and of the sidecar (``/proc``), and of SeaweedFS (for
information: it is the store, not dstl). The best round is judged against
the goal: :data:`GOAL_MB_S_2_CORES` on up to 8 CPUs,
:data:`GOAL_MB_S_MANY_CORES` on more. ``--profile DIR`` also writes a cProfile
of one subtask's upload (the last round's) and of the sidecar.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

#: goal: materialization through one node on a 2-core machine, MB/s (10^6 bytes stored)
GOAL_MB_S_2_CORES = 150.0
#: goal on a larger machine (16 cores)
GOAL_MB_S_MANY_CORES = 200.0
#: machines with more CPUs than this are judged against GOAL_MB_S_MANY_CORES
SMALL_MACHINE_CPUS = 8
JOB_ID = "mat-bench"
MAX_PARALLELISM = 128


def goal_mb_s(cpus: int | None = None) -> float:
    """The goal for a machine of ``cpus`` CPUs (this one's by default)."""
    n = (os.cpu_count() or 1) if cpus is None else cpus
    return GOAL_MB_S_2_CORES if n <= SMALL_MACHINE_CPUS else GOAL_MB_S_MANY_CORES


@dataclass(frozen=True, slots=True)
class Upload:
    """One subtask's upload in one round. Frozen."""

    seconds: float
    stored_bytes: int
    cpu_s: float


@dataclass(frozen=True, slots=True)
class Round:
    """Every subtask's upload of one round, and the servers' CPU meanwhile. Frozen."""

    uploads: tuple[Upload, ...]
    sidecar_cpu_s: float
    store_cpu_s: float

    @property
    def stored_mb(self) -> float:
        return sum(u.stored_bytes for u in self.uploads) / 1e6

    @property
    def longest_s(self) -> float:
        return max(u.seconds for u in self.uploads)

    @property
    def mb_s(self) -> float:
        return self.stored_mb / max(self.longest_s, 1e-9)

    def ms_per_mb(self, cpu_s: float) -> float:
        return 1000.0 * cpu_s / max(self.stored_mb, 1e-9)


def _ranges(subtasks: int) -> list[tuple[int, int]]:
    per = MAX_PARALLELISM // subtasks
    return [(i * per, (i + 1) * per - 1) for i in range(subtasks)]


def build_store(directory: Path, kg_range: tuple[int, int], keys: int, value_bytes: int) -> None:
    """A store of ``keys`` rows (12-byte keys, ``value_bytes`` values) over ``kg_range``."""
    from dstl_client.keygroups import KeyGroupRange
    from dstl_client.state.store import LocalKeyedStore

    first, last = kg_range
    n_kg = last - first + 1
    with LocalKeyedStore(directory, KeyGroupRange(first, last)) as store:
        filler = os.urandom(value_bytes)
        rows = (
            (first + i % n_kg, f"k-{i:010d}".encode(), i.to_bytes(8, "little") + filler[8:])
            for i in range(keys)
        )
        store.write_main(rows)
        store.mark_changed({kg: 0 for kg in range(first, last + 1)})
        store.set_meta(main_version=0)
        store.commit()


def upload_store(
    directory: str, kg_range: tuple[int, int], address: str, profile: str = "", read_ahead: int = -1
) -> Upload:
    """Upload every key group of the store at ``directory`` as one part (a subtask's process)."""
    import cProfile

    from dstl_client.client import ChangelogClient
    from dstl_client.state.snapshot_upload import upload_snapshot
    from dstl_client.state.store import SnapshotReader

    reader = SnapshotReader(Path(directory) / "state.sqlite")
    client = ChangelogClient(address)
    prof = cProfile.Profile() if profile else None
    try:
        cpu0, t0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        writer = client.create_writer(job_id=JOB_ID, operator_id="mat", key_group_range=kg_range)
        try:
            kgs = list(range(kg_range[0], kg_range[1] + 1))
            if read_ahead < 0:  # the default
                done = upload_snapshot(reader, writer, kgs, 600.0)
            else:
                done = upload_snapshot(reader, writer, kgs, 600.0, read_ahead=read_ahead)
        finally:
            writer.close()
        if prof is not None:
            prof.disable()
            prof.dump_stats(profile)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        reader.close()
        client.close()
    assert done.part is not None
    return Upload(seconds, done.part.stored_bytes, cpu)


def _warm() -> int:
    import dstl_client.client
    import dstl_client.state.snapshot_upload  # noqa: F401

    return os.getpid()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0.0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    keys: int,
    value_bytes: int,
    subtasks: int,
    rounds: int,
    work: Path,
    profile: Path | None,
    read_ahead: int = -1,
) -> list[Round]:
    from dstl_server.testing import ServerProcess
    from dstl_server.testing_s3 import SeaweedS3

    ranges = _ranges(subtasks)
    for i, r in enumerate(ranges):
        build_store(work / f"store-{i}", r, keys, value_bytes)
    out: list[Round] = []
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(SeaweedS3())
        sidecar = ServerProcess(
            work / "sidecar",
            storage=s3.storage_url("mat"),
            extra_args=s3.server_args(),
            env=s3.env(),
        )
        if profile is not None:  # the sidecar writes its profile when it stops (SIGTERM)
            i = sidecar.args.index("-m")
            sidecar.args[i:i] = ["-m", "cProfile", "-o", str(profile / "sidecar.prof")]
        stack.enter_context(sidecar)
        assert sidecar.proc is not None and s3.proc is not None
        pool = stack.enter_context(
            ProcessPoolExecutor(max_workers=subtasks, mp_context=get_context("spawn"))
        )
        pids = {f.result() for f in [pool.submit(_warm) for _ in range(subtasks * 2)]}
        print(f"SeaweedFS {s3.endpoint_url}, dstl-server {sidecar.address}, pids {sorted(pids)}")
        for n in range(rounds):
            prof = str(profile / "client.prof") if profile is not None and n == rounds - 1 else ""
            side0, store0 = _cpu_s(sidecar.proc.pid), _cpu_s(s3.proc.pid)
            futures = [
                pool.submit(
                    upload_store,
                    str(work / f"store-{i}"),
                    r,
                    sidecar.address,
                    prof if i else "",
                    read_ahead,
                )
                for i, r in enumerate(ranges)
            ]
            uploads = tuple(f.result() for f in futures)
            rnd = Round(uploads, _cpu_s(sidecar.proc.pid) - side0, _cpu_s(s3.proc.pid) - store0)
            out.append(rnd)
            client_cpu = sum(u.cpu_s for u in uploads)
            print(
                f"round {n + 1}: {rnd.stored_mb:.1f} MB, longest upload {rnd.longest_s:.2f} s, "
                f"{rnd.mb_s:.1f} MB/s; CPU ms per MB: subtasks {rnd.ms_per_mb(client_cpu):.2f}, "
                f"sidecar {rnd.ms_per_mb(rnd.sidecar_cpu_s):.2f}, together "
                f"{rnd.ms_per_mb(client_cpu + rnd.sidecar_cpu_s):.2f} "
                f"(SeaweedFS {rnd.ms_per_mb(rnd.store_cpu_s):.2f})",
                flush=True,
            )
        sidecar.stop()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.mat_bench", description=__doc__)
    parser.add_argument("--keys", type=int, default=400_000, help="rows per subtask (400,000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per value (100)")
    parser.add_argument("--subtasks", type=int, default=2, help="subtasks uploading at once (2)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (4)")
    parser.add_argument(
        "--read-ahead", type=int, default=-1, help="upload_snapshot's read_ahead (its default)"
    )
    parser.add_argument("--profile", type=Path, default=None, help="write cProfiles into DIR")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    ns = parser.parse_args(argv)
    if ns.keys < 1 or ns.value_bytes < 8 or not 1 <= ns.subtasks <= 16 or ns.rounds < 1:
        parser.error("--keys >= 1, --value-bytes >= 8, --subtasks 1..16, --rounds >= 1")
    if ns.profile is not None:
        ns.profile.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        if ns.dir is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dstl-mat-bench-")))
        else:
            work = ns.dir
            work.mkdir(parents=True, exist_ok=True)
        rounds = run(
            ns.keys, ns.value_bytes, ns.subtasks, ns.rounds, work, ns.profile, ns.read_ahead
        )
    best = max(rounds, key=lambda r: r.mb_s)
    goal = goal_mb_s()
    together = [r.ms_per_mb(sum(u.cpu_s for u in r.uploads) + r.sidecar_cpu_s) for r in rounds]
    print(
        f"load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"{os.cpu_count()} CPUs; median {statistics.median(r.mb_s for r in rounds):.1f} MB/s, "
        f"median CPU {statistics.median(together):.2f} ms per MB (subtasks + sidecar)"
    )
    ok = best.mb_s >= goal
    print(
        f"  {'PASS' if ok else 'MISS'}  materialization through one node: {best.mb_s:.1f} MB/s "
        f"({ns.subtasks} subtasks at once; goal >= {goal:g} MB/s)"
    )
    if ns.profile is not None:
        print(f"profiles in {ns.profile}: client.prof (one subtask), sidecar.prof")
    return 0


if __name__ == "__main__":
    sys.exit(main())
