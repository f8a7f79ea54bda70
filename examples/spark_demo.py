"""The main demo: a PySpark Structured Streaming job with keyed state on the DSTL.

What it does (local mode, one machine, a few minutes on 2 cores):

1. starts a ``dstl-server`` sidecar on embedded ``file://`` storage;
2. runs the job: per-key running aggregates (count, sum, max) over a
   generated stream (``rate-micro-batch``) with a large key space, state in
   the changelog backend, a checkpoint per micro-batch and a materialization
   every few seconds;
3. kills the job's driver with SIGKILL in the middle of the stream, restarts
   it from its checkpoint on a fresh node-local state directory (every
   subtask restores from the DSTL) and with another parallelism (rescaling),
   and lets it finish;
4. runs the same job once more without a kill, and checks that the final
   state of both runs is identical;
5. prints per-checkpoint duration and bytes against the state size.

Run it with ``make demo`` or ``.venv/bin/python examples/spark_demo.py``.
Exit code 0 means the states were equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


# --------------------------------------------------------------------- the job
def aggregate(key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
    """Running count, sum and max of ``v`` per key."""
    state = ctx.value_state("agg", _AGG)
    count, total, peak = state.value() or (0, 0, -1)
    for r in rows:
        v = r["v"]
        count += 1
        total += v
        peak = max(peak, v)
    state.update((count, total, peak))
    yield key, count, total, peak


def _agg_serializer() -> Any:
    from dstl_client.state import INT64, TupleSerializer

    return TupleSerializer(INT64, INT64, INT64)


_AGG = _agg_serializer()


def run_job(args: argparse.Namespace) -> int:
    """One driver process: run the query until ``--batches`` checkpoints exist."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from dstl_client.spark import process_keyed

    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName(f"dstl-demo-{args.job_id}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.parallelism))
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    # one input file per micro-batch: the stream is replayable and ends after --batches
    events = (
        spark.readStream.schema("user string, v long")
        .option("maxFilesPerTrigger", 1)
        .parquet(args.input_dir)
    )
    q = process_keyed(
        events,
        key="user",
        fn=aggregate,
        output_schema="user string, count long, total long, peak long",
        parallelism=args.parallelism,
        max_parallelism=args.max_parallelism,
        checkpoint_dir=args.checkpoint_dir,
        job_id=args.job_id,
        dstl_address=args.address,
        state_dir=args.state_dir,
        materialize_interval_s=args.materialize_interval,
        metrics_port=0,
    )
    history = Path(args.checkpoint_dir) / "history.jsonl"
    print(
        f"[{args.job_id}] driver pid {os.getpid()} parallelism {args.parallelism}, "
        f"metrics on :{q.metrics_port}, resuming after batch {q.last_batch_id}",
        flush=True,
    )
    seen = len(q.history)
    try:
        while q.last_batch_id < args.batches - 1:
            q.wait_for_batch(q.last_batch_id + 1, timeout_s=600)
            with history.open("a") as f:
                for stats in q.history[seen:]:
                    h = stats.to_json()
                    f.write(
                        json.dumps({**h, "run": args.run, "parallelism": args.parallelism}) + "\n"
                    )
                    f.flush()
                    print(_line(h), flush=True)
            seen = len(q.history)
    finally:
        q.stop()
        spark.stop()
    return 0


# ------------------------------------------------------------ the orchestrator
def _line(h: dict[str, Any]) -> str:
    mat = (
        f"  materialized {h['mat_bytes'] / 1e6:6.2f} MB in {h['mat_max_s']:.2f}s"
        if h["materialized"]
        else ""
    )
    restored = (
        f"  restored {h['restored_subtasks']} subtasks in {h['restore_max_s']:.2f}s"
        if h["restored_subtasks"]
        else ""
    )
    return (
        f"  batch {h['batch_id']:3d}: {h['rows']:6d} rows  checkpoint {h['checkpoint_s'] * 1000:6.1f} ms "
        f"{h['persisted_bytes'] / 1e6:6.2f} MB  state {h['state_bytes'] / 1e6:7.2f} MB  "
        f"checkpoint refers to {h['checkpoint_size_bytes'] / 1e6:6.2f} MB{mat}{restored}"
    )


def _job_cmd(args: argparse.Namespace, **over: Any) -> list[str]:
    opts = {
        "address": args.address,
        "input-dir": args.input_dir,
        "batches": args.batches,
        "rows-per-batch": args.rows_per_batch,
        "keys": args.keys,
        "max-parallelism": args.max_parallelism,
        "materialize-interval": args.materialize_interval,
        "cores": args.cores,
    }
    opts.update({k.replace("_", "-"): v for k, v in over.items()})
    cmd = [sys.executable, str(HERE), "job"]
    for k, v in opts.items():
        cmd += [f"--{k}", str(v)]
    return cmd


def write_input(directory: Path, batches: int, rows: int, keys: int) -> None:
    """The generated stream: ``batches`` Parquet files of ``rows`` rows, oldest first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - batches - 10
    for b in range(batches):
        first = b * rows
        users = [f"user-{(i * 2654435761) % keys}" for i in range(first, first + rows)]
        values = [(i * 40503) % 1000 for i in range(first, first + rows)]
        path = directory / f"part-{b:05d}.parquet"
        pq.write_table(pa.table({"user": users, "v": pa.array(values, pa.int64())}), path)
        os.utime(path, (base + b, base + b))  # the file source reads oldest first


def _records(checkpoint_dir: Path) -> list[int]:
    d = checkpoint_dir / "dstl" / "checkpoints"
    if not d.exists():
        return []
    return sorted(int(p.name[3:15]) for p in d.glob("ck-*.json"))


def _final_state(checkpoint_dir: Path, address: str) -> dict[tuple[int, bytes], bytes]:
    from dstl_client.batch.local import checkpoint_rows
    from dstl_client.client import ChangelogClient
    from dstl_client.coordinator.storage import CheckpointStorage

    storage = CheckpointStorage(checkpoint_dir / "dstl" / "checkpoints")
    record = storage.load(storage.batch_ids()[-1])
    with ChangelogClient(address) as client:
        return checkpoint_rows(record, client)


def run_demo(args: argparse.Namespace) -> int:
    from dstl_server.testing import ServerProcess

    own_workdir = not args.workdir
    work = Path(args.workdir or tempfile.mkdtemp(prefix="dstl-spark-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"dstl Spark demo: work directory {work}")
    args.input_dir = str(work / "input")
    write_input(Path(args.input_dir), args.batches, args.rows_per_batch, args.keys)
    with ServerProcess(work / "sidecar") as sidecar:
        args.address = sidecar.address
        print(
            f"sidecar pid {sidecar.proc.pid if sidecar.proc else '?'} at {sidecar.address}, storage {sidecar.storage}"
        )
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

        # run A: killed mid-stream, restarted from its checkpoint
        ck_a = work / "run-a"
        print(
            f"\n== run A: {args.batches} batches of {args.rows_per_batch} rows, "
            f"SIGKILL after checkpoint {args.kill_after}, restart on a fresh node"
        )
        proc = subprocess.Popen(
            _job_cmd(
                args,
                job_id="demo-a",
                run="A1",
                checkpoint_dir=ck_a,
                state_dir=work / "state-a1",
                parallelism=args.parallelism,
            ),
            env=env,
            start_new_session=True,
        )
        try:
            while not _records(ck_a) or _records(ck_a)[-1] < args.kill_after:
                if proc.poll() is not None:
                    print(f"job exited early with {proc.returncode}")
                    return 2
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
        killed_at = _records(ck_a)[-1]
        print(f"-- killed the driver (SIGKILL) with checkpoint {killed_at} recorded")
        rc = subprocess.call(
            _job_cmd(
                args,
                job_id="demo-a",
                run="A2",
                checkpoint_dir=ck_a,
                state_dir=work / "state-a2",
                parallelism=args.restart_parallelism,
            ),
            env=env,
        )
        if rc:
            print(f"restarted job failed with {rc}")
            return 2

        # run B: the same job without a failure
        ck_b = work / "run-b"
        print("\n== run B: the same job without a kill")
        rc = subprocess.call(
            _job_cmd(
                args,
                job_id="demo-b",
                run="B",
                checkpoint_dir=ck_b,
                state_dir=work / "state-b",
                parallelism=args.parallelism,
            ),
            env=env,
        )
        if rc:
            print(f"job B failed with {rc}")
            return 2

        state_a = _final_state(ck_a, sidecar.address)
        state_b = _final_state(ck_b, sidecar.address)

    history = [json.loads(line) for line in (ck_a / "history.jsonl").read_text().splitlines()]
    _summary(history)
    total_rows = args.batches * args.rows_per_batch
    counted = sum(_AGG.loads(v)[0] for v in state_a.values())
    print(f"\nfinal state: {len(state_a)} keys, {counted} rows counted (input {total_rows})")
    print(f"wall time {time.monotonic() - started:.0f} s")
    if state_a == state_b and counted == total_rows:
        print(
            "OK: the killed-and-restarted run ends with exactly the state of the failure-free run"
        )
        if own_workdir:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    diff = {k for k in state_a.keys() | state_b.keys() if state_a.get(k) != state_b.get(k)}
    print(f"MISMATCH: {len(diff)} keys differ")
    return 1


def _summary(history: list[dict[str, Any]]) -> None:
    steady = [h for h in history if not h["restored_subtasks"] and h["batch_id"] > 0]
    if not steady:
        return
    cp = sorted(h["checkpoint_s"] * 1000 for h in steady)
    mats = [h for h in steady if h["materialized"]]
    first, last = steady[0], steady[-1]
    print("\n== run A, checkpoints without a restore:")
    print(
        f"  checkpoint duration median {statistics.median(cp):.1f} ms, max {cp[-1]:.1f} ms, "
        f"persisted median {statistics.median(h['persisted_bytes'] for h in steady) / 1e6:.2f} MB per checkpoint"
    )
    print(
        f"  state grew from {first['state_bytes'] / 1e6:.1f} MB to {last['state_bytes'] / 1e6:.1f} MB; "
        f"{len(mats)} materializations, median {statistics.median(h['mat_bytes'] for h in mats) / 1e6 if mats else 0:.2f} MB"
    )
    restores = [h for h in history if h["restored_subtasks"]]
    for h in restores:
        print(
            f"  restart: batch {h['batch_id']} restored {h['restored_subtasks']} subtasks in {h['restore_max_s']:.2f}s"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("role", nargs="?", default="demo", choices=["demo", "job"])
    p.add_argument("--workdir", default="")
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--rows-per-batch", type=int, default=25_000)
    p.add_argument("--keys", type=int, default=250_007, help="size of the key space")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--restart-parallelism", type=int, default=3)
    p.add_argument("--max-parallelism", type=int, default=128)
    p.add_argument("--materialize-interval", type=float, default=4.0)
    p.add_argument("--kill-after", type=int, default=8, help="SIGKILL once this checkpoint exists")
    p.add_argument("--cores", type=int, default=2)
    # job role only
    p.add_argument("--job-id", default="demo")
    p.add_argument("--run", default="")
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--state-dir", default="")
    p.add_argument("--address", default="")
    p.add_argument("--input-dir", default="")
    args = p.parse_args(argv)
    if args.role == "job":
        return run_job(args)
    return run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
