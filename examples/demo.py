"""The dstl core demo (``make demo-core``): a sidecar, concurrent writers, checkpoints, recovery.

What it does, end to end, against a real ``dstl-server`` process on embedded
``file://`` storage:

1. starts the sidecar (``dstl-server``) on a temporary directory;
2. runs several writers on threads, as the state backends of one PySpark
   executor would: each keeps a small keyed state and appends every update
   to its changelog;
3. takes checkpoints: every writer calls ``persist_durably`` at the same
   time and gets a handle (all writers' changes go into one object per flush);
4. materializes half-way: each writer snapshots its state, then truncates the
   log before that point, so later checkpoints carry only the changes since;
5. restarts the sidecar and recovers: every checkpoint's handles are read
   back through the new sidecar, every byte compared with what was written,
   and each writer's state is rebuilt from snapshot + changelog;
6. prints a summary. Exits 1 if any check fails; the sidecar is always stopped.

Run ``python examples/demo.py --help`` for the knobs.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_server.testing import ServerProcess

JOB_ID = "demo-job"
MAX_PARALLELISM = 128  # key groups of the job, as in Flink
KEYS_PER_KEY_GROUP = 50
WAIT_S = 60.0
_KEY = struct.Struct("<I")


class DemoFailure(Exception):
    """A check of the demo failed."""


@dataclass
class Writer:
    """One state backend: its log writer, its state and everything it wrote."""

    index: int
    key_groups: tuple[int, int]
    rng: random.Random
    state: dict[int, bytes] = field(default_factory=dict)
    #: every change appended: (checkpoint it belongs to, key group, bytes)
    changes: list[tuple[int, int, bytes]] = field(default_factory=list)
    #: per checkpoint: the handle as bytes (what would travel to the driver)
    handles: dict[int, bytes] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)
    snapshot: dict[int, bytes] = field(default_factory=dict)
    #: changes of checkpoints <= this are covered by the snapshot
    materialized_at: int = 0
    state_at: dict[int, dict[int, bytes]] = field(default_factory=dict)

    def update(self, checkpoint: int) -> tuple[int, bytes]:
        """One state update ``key := random value`` as a change record."""
        kg = self.rng.randint(*self.key_groups)
        key = kg * KEYS_PER_KEY_GROUP + self.rng.randrange(KEYS_PER_KEY_GROUP)
        value = self.rng.randbytes(self.rng.randint(16, 400))
        self.state[key] = value
        data = _KEY.pack(key) + value
        self.changes.append((checkpoint, kg, data))
        return kg, data


def ranges(writers: int) -> list[tuple[int, int]]:
    """Split the key groups into contiguous ranges, one per writer (inclusive)."""
    bounds = [MAX_PARALLELISM * i // writers for i in range(writers + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(writers)]


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


# ----------------------------------------------------------------- writing
def run_writer(
    wr: Writer,
    w: ChangelogWriter,
    args: argparse.Namespace,
    checkpoint_barrier: threading.Barrier,
    done_barrier: threading.Barrier,
) -> None:
    """Append, checkpoint together with the others, materialize half-way."""
    after = 0  # persist from here: 0, then the materialization boundary
    chunks = 10
    per_chunk = max(1, args.changes_per_checkpoint // chunks)
    for cp in range(1, args.checkpoints + 1):
        for _ in range(chunks):  # a stream of updates over the interval
            w.append_many([wr.update(cp) for _ in range(per_chunk)])
            time.sleep(args.interval / chunks)
        checkpoint_barrier.wait(WAIT_S)  # the checkpoint barrier reaches every writer
        t0 = time.perf_counter()
        handle = w.persist_durably(after=after).result(timeout=WAIT_S)
        wr.latencies_s.append(time.perf_counter() - t0)
        wr.handles[cp] = handle.to_bytes()
        wr.state_at[cp] = dict(wr.state)
        if cp == args.materialize_at:
            # Materialization: snapshot the state (a real job writes it to its
            # snapshot store), then tell the log those changes are no longer needed.
            boundary = w.last_appended_sqn()
            wr.snapshot = dict(wr.state)
            wr.materialized_at = cp
            w.truncate(before=boundary)
            after = boundary
        done_barrier.wait(WAIT_S)


def write_phase(address: str, writers: list[Writer], args: argparse.Namespace) -> None:
    n = len(writers)
    checkpoint_barrier = threading.Barrier(n + 1)
    done_barrier = threading.Barrier(n + 1)
    errors: list[BaseException] = []

    def body(wr: Writer, client: ChangelogClient) -> None:
        try:
            with client.create_writer(
                job_id=JOB_ID, operator_id="demo-counts", key_group_range=wr.key_groups
            ) as w:
                run_writer(wr, w, args, checkpoint_barrier, done_barrier)
        except BaseException as exc:
            errors.append(exc)
            checkpoint_barrier.abort()
            done_barrier.abort()

    with ChangelogClient(address) as client:
        client.wait_ready(30)
        threads = [
            threading.Thread(target=body, args=(wr, client), name=f"writer-{wr.index}")
            for wr in writers
        ]
        for t in threads:
            t.start()
        completed = 0
        try:
            seen: set[str] = set()
            for cp in range(1, args.checkpoints + 1):
                checkpoint_barrier.wait(WAIT_S)
                done_barrier.wait(WAIT_S)
                new_keys: set[str] = set()
                for wr in writers:
                    h = ChangelogHandle.from_bytes(wr.handles[cp])
                    new_keys |= set(h.object_keys) - seen
                seen |= new_keys
                changes = sum(1 for wr in writers for c in wr.changes if c[0] == cp)
                nbytes = sum(len(c[2]) for wr in writers for c in wr.changes if c[0] == cp)
                lat = [wr.latencies_s[cp - 1] * 1000 for wr in writers]
                note = "  (materialized: logs truncated)" if cp == args.materialize_at else ""
                print(
                    f"checkpoint {cp}: {n} writers persisted {changes:,} new changes "
                    f"({nbytes / 1e6:.2f} MB) in {len(new_keys)} new object(s); "
                    f"persist {min(lat):.1f}-{max(lat):.1f} ms{note}",
                    flush=True,
                )
                completed = cp
        except threading.BrokenBarrierError:
            pass  # a writer failed or hung; reported below
        finally:
            if completed < args.checkpoints:  # release writers still at a barrier
                checkpoint_barrier.abort()
                done_barrier.abort()
            for t in threads:
                t.join(WAIT_S)
    if errors:
        raise DemoFailure(f"a writer failed: {errors[0]!r}") from errors[0]
    if completed < args.checkpoints:
        raise DemoFailure(f"only {completed} of {args.checkpoints} checkpoints completed")


# ----------------------------------------------------------------- recovery
def expected_changes(wr: Writer, first_cp: int, last_cp: int) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = defaultdict(list)
    for cp, kg, data in wr.changes:
        if first_cp <= cp <= last_cp:
            out[kg].append(data)
    return out


def verify(address: str, writers: list[Writer], args: argparse.Namespace) -> tuple[int, int]:
    """Read every checkpoint's handles back and rebuild every writer's state.

    Returns (changes verified, bytes verified); raises DemoFailure on any mismatch.
    """
    changes_ok = 0
    bytes_ok = 0
    with ChangelogClient(address) as client:
        client.wait_ready(30)
        for wr in writers:
            for cp, blob in sorted(wr.handles.items()):
                handle = ChangelogHandle.from_bytes(blob)
                first_cp = wr.materialized_at + 1 if cp > wr.materialized_at else 1
                want = expected_changes(wr, first_cp, cp)
                got: dict[int, list[bytes]] = defaultdict(list)
                for kg, sqn, data in client.read_changes(handle):
                    if not handle.from_sqn <= sqn < handle.to_sqn:
                        raise DemoFailure(
                            f"writer {wr.index} checkpoint {cp}: SQN {sqn} outside "
                            f"[{handle.from_sqn}, {handle.to_sqn})"
                        )
                    got[kg].append(data)
                if dict(got) != dict(want):
                    raise DemoFailure(
                        f"writer {wr.index} checkpoint {cp}: read back "
                        f"{sum(map(len, got.values()))} changes, expected "
                        f"{sum(map(len, want.values()))} (or different bytes)"
                    )
                changes_ok += sum(len(v) for v in want.values())
                bytes_ok += sum(len(d) for v in want.values() for d in v)
                # Rescaling: a new subtask reads only its key groups.
                first, last = wr.key_groups
                half = list(range(first, (first + last) // 2 + 1))
                part: dict[int, list[bytes]] = defaultdict(list)
                for kg, _sqn, data in client.read_changes(handle, key_groups=half):
                    part[kg].append(data)
                if dict(part) != {kg: v for kg, v in want.items() if kg in half}:
                    raise DemoFailure(f"writer {wr.index} checkpoint {cp}: key-group read differs")
                # Recovery: snapshot (if any) + changelog replay == state at the checkpoint.
                state = dict(wr.snapshot) if cp > wr.materialized_at else {}
                for kg in sorted(got):
                    for data in got[kg]:
                        (key,) = _KEY.unpack_from(data)
                        state[key] = data[_KEY.size :]
                if state != wr.state_at[cp]:
                    raise DemoFailure(f"writer {wr.index} checkpoint {cp}: recovered state differs")
    return changes_ok, bytes_ok


# ----------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--writers", type=int, default=4, help="concurrent writers (default 4)")
    p.add_argument("--checkpoints", type=int, default=8, help="checkpoints to take (default 8)")
    p.add_argument(
        "--interval", type=float, default=1.0, help="seconds between checkpoints (default 1)"
    )
    p.add_argument(
        "--changes-per-checkpoint",
        type=int,
        default=4000,
        help="state updates per writer between checkpoints (default 4000)",
    )
    p.add_argument(
        "--materialize-at",
        type=int,
        default=None,
        help="checkpoint after which state is materialized and logs truncated (default: half-way)",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="work directory (e.g. ./var/demo); default a temp dir removed afterwards",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    args = p.parse_args(argv)
    if args.writers < 1 or args.checkpoints < 2:
        p.error("need at least 1 writer and 2 checkpoints")
    if args.materialize_at is None:
        args.materialize_at = args.checkpoints // 2
    if not 1 <= args.materialize_at < args.checkpoints:
        p.error("--materialize-at must be between 1 and checkpoints - 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    made = args.dir is None
    root = Path(tempfile.mkdtemp(prefix="dstl-demo-")) if made else args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    writers = [
        Writer(i, kgs, random.Random(seed * 1000 + i)) for i, kgs in enumerate(ranges(args.writers))
    ]
    try:
        with ServerProcess(root / "sidecar") as server:
            assert server.proc is not None
            print(
                f"sidecar started: pid {server.proc.pid}, grpc {server.address}, "
                f"storage {server.storage}",
                flush=True,
            )
            print(
                f"{args.writers} writers, {args.checkpoints} checkpoints every "
                f"{args.interval:g}s, materialization after checkpoint {args.materialize_at} "
                f"(seed {seed})",
                flush=True,
            )
            write_phase(server.address, writers, args)
            code = server.stop()
            if code != 0:
                raise DemoFailure(f"the sidecar exited with code {code} on SIGTERM")
        objects = sorted((root / "sidecar" / "objects" / JOB_ID).rglob("*.dstl"))
        stored = sum(p.stat().st_size for p in objects)
        print(
            f"sidecar stopped; {len(objects)} objects ({stored / 1e6:.2f} MB) on disk. "
            "Restarting it for recovery ...",
            flush=True,
        )
        with ServerProcess(root / "sidecar") as server:
            changes_ok, bytes_ok = verify(server.address, writers, args)
            server.stop()
        latencies_ms = [lat * 1000 for wr in writers for lat in wr.latencies_s]
        total_changes = sum(len(wr.changes) for wr in writers)
        total_bytes = sum(len(c[2]) for wr in writers for c in wr.changes)
        handles = sum(len(wr.handles) for wr in writers)
        print()
        print("summary")
        print(f"  writers              {args.writers} (key groups 0-{MAX_PARALLELISM - 1})")
        print(
            f"  checkpoints          {args.checkpoints} (materialized after {args.materialize_at})"
        )
        print(f"  changes appended     {total_changes:,} ({total_bytes / 1e6:.2f} MB)")
        print(
            f"  objects written      {len(objects)} ({stored / 1e6:.2f} MB) for "
            f"{args.checkpoints} checkpoints x {args.writers} writers"
        )
        print(
            f"  persist latency      p50 {quantile(latencies_ms, 0.5):.1f} ms, "
            f"p99 {quantile(latencies_ms, 0.99):.1f} ms, max {max(latencies_ms):.1f} ms "
            f"({len(latencies_ms)} persists)"
        )
        print(
            f"  recovery             {handles} handles read back after a sidecar restart "
            f"({changes_ok:,} changes compared, every appended change at least once); "
            "every writer's state rebuilt from snapshot + changelog at every checkpoint"
        )
        print(f"  time                 {time.monotonic() - t_start:.1f}s")
        print(
            f"OK: all bytes verified ({bytes_ok:,} bytes read back and compared, {handles} handles)"
        )
        return 0
    except DemoFailure as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"FAILED: {exc!r}", file=sys.stderr)
        return 1
    finally:
        if made:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
