"""One driver process of the job (``loadtest.cluster_bench.job``) and its phase log.

The driver gets the cluster's ``jvm_options`` (see :mod:`loadtest.spark_cluster`)
as ``--jvm-options``; the job sets them as the driver's and the executors'
extra Java options.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dstl_client.coordinator.config import spark_location
from loadtest.spark_cluster import SparkCluster

ROOT = Path(__file__).resolve().parents[2]


def checkpoint_dir(work: Path) -> Path:
    """The job's checkpoint directory under ``work`` (every driver of a run shares it)."""
    return work / "spark-ckpt"


def spark_checkpoint(work: Path) -> Path:
    """Spark's own checkpoint location of the job's keyed operator (offsets, commits)."""
    return Path(spark_location(str(checkpoint_dir(work))))


@dataclass(slots=True)
class Phases:
    """The ``planned``/``tasks_done``/``recorded`` times of every batch (unix seconds).

    A batch planned more than once (re-run after a failed attempt) keeps the
    first ``planned`` time and counts its attempts.
    """

    planned: dict[int, float] = field(default_factory=dict)
    tasks_done: dict[int, float] = field(default_factory=dict)
    recorded: dict[int, float] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    _offset: int = 0

    def poll(self, path: Path) -> list[tuple[str, int, float]]:
        """Read the lines appended since the last call; returns them."""
        if not path.exists():
            return []
        with open(path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self._offset += end
        new: list[tuple[str, int, float]] = []
        for line in data[:end].decode().splitlines():
            phase, batch, at = line.split()
            b, t = int(batch), float(at)
            new.append((phase, b, t))
            if phase == "planned":
                self.attempts[b] = self.attempts.get(b, 0) + 1
                self.planned.setdefault(b, t)
            elif phase == "tasks_done":
                self.tasks_done[b] = t
            elif phase == "recorded":
                self.recorded[b] = t
        return new

    @property
    def last_recorded(self) -> int:
        return max(self.recorded, default=-1)


class Driver:
    """The job's driver in its own process group (killed as a whole by :meth:`kill`)."""

    def __init__(
        self,
        work: Path,
        cluster: SparkCluster,
        address: str,
        *,
        until: int | None = None,
        until_files: int | None = None,
        parallelism: int = 4,
        phases_file: Path | None = None,
        timeout_s: float = 400.0,
        crash: str = "",
        module: str = "loadtest.cluster_bench.job",
    ) -> None:
        # ``module``: the job's driver script; it takes the arguments below (the chaos
        # bench runs its own keyed job with the same command line)
        cmd = [sys.executable, "-m", module]
        args: dict[str, object] = {
            "master": cluster.master_url,
            "address": address,
            "checkpoint-dir": checkpoint_dir(work),
            "metadata-url": f"s3://{cluster.s3.bucket}/{cluster.s3_prefix}/metadata",
            "input-dir": work / "input",
            "out-dir": work / "out",
            "until-batch": until,
            "until-files": until_files,
            "executors": len(cluster.nodes),
            "parallelism": parallelism,
            "phases-file": phases_file or "",
            "timeout-s": timeout_s,
            "crash": crash,
            # the cluster's JVM options for the driver's and the executors' JVMs
            "jvm-options": cluster.jvm_options or None,
        }
        # ``--name=value``: a value may start with "-" (JVM options do)
        cmd += [f"--{name}={value}" for name, value in args.items() if value is not None]
        env = {**os.environ, **cluster.s3.env(), "PYSPARK_PYTHON": sys.executable}
        env["AWS_ENDPOINT_URL"] = cluster.s3.endpoint_url
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        if cluster.jvm_options:  # the launcher JVM that spark-submit starts first
            env["SPARK_LAUNCHER_OPTS"] = cluster.jvm_options
        for name in ("DSTL_ADDRESS", "DSTL_STATE_DIR"):
            env.pop(name, None)
        disk = work / f"driver-disk-{time.monotonic_ns()}"
        disk.mkdir(parents=True)
        env["TMPDIR"] = str(disk)
        self.log = disk / "driver.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout_s: float) -> int:
        """Its exit code; SIGKILLs the group after ``timeout_s`` and raises ``TimeoutError``
        carrying the tail of the driver's log (what it was doing when it hung)."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(
                f"the driver ran past {timeout_s:.0f} s; its log ends with:\n{self.tail(12000)}"
            ) from None
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the driver's process group and reap it (idempotent)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""
