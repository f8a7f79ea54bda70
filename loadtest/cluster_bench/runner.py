"""One node count measured: a fresh cluster, the job, the node kills, the outputs checked."""

from __future__ import annotations

import contextlib
import random
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.cluster_bench.config import BenchConfig
from loadtest.cluster_bench.driver import Driver, Phases, spark_checkpoint
from loadtest.cluster_bench.workload import compare, expected_outputs, read_outputs, write_input
from loadtest.spark_cluster import START_TIMEOUT_S, Node, SparkCluster
from loadtest.spark_offsets import file_groups

UPLOADS_OK = 'dstl_uploads_total{result="ok"}'
#: what an executor logs once it is registered with the driver (log4j INFO)
EXECUTOR_REGISTERED = "Successfully registered with driver"
EXECUTOR_WAIT_S = 120.0
#: a deferred kill waits this many batches after the victim is back (not its first batch)
DEFERRED_KILL_GAP = 3
Log = Callable[[str], None]


@dataclass(slots=True)
class KillEvent:
    """One node SIGKILLed and started again (unix times)."""

    node: str
    #: the batch planned last when the node was killed
    batch: int
    _: KW_ONLY
    killed_at: float
    #: the node's new worker registered with the master
    restarted_at: float = 0.0
    #: an executor of the job registered with the driver from the new worker (0: not seen)
    rejoined_at: float = 0.0
    #: objects the killed sidecar had uploaded (scraped just before the kill)
    uploads_before: float = 0.0
    #: the batch the kill was due at when it had to wait for the previous victim
    due_batch: int | None = None


@dataclass(slots=True)
class DriverExit:
    """A driver that exited before the last batch (and was started again)."""

    returncode: int
    last_recorded: int
    tail: str


@dataclass(slots=True)
class NodeCountResult:
    """What one node count measured; :mod:`loadtest.cluster_bench.stats` derives the figures."""

    nodes: int
    batches: int
    phases: Phases
    kills: list[KillEvent]
    #: objects uploaded (``result="ok"``) by each node's sidecars, every incarnation summed
    uploads: dict[str, float]
    driver_uploads: float
    missing_rows: int
    unexpected_rows: int
    mismatch_sample: str
    expected_rows: int
    driver_exits: list[DriverExit] = field(default_factory=list)
    wall_s: float = 0.0
    cluster_up_s: float = 0.0
    error: str = ""

    @property
    def exactly_once(self) -> bool:
        return (
            not self.error
            and self.missing_rows == 0
            and self.unexpected_rows == 0
            and self.phases.last_recorded == self.batches - 1
        )


def _uploads(sidecar: ServerProcess, log: Log) -> float:
    """The sidecar's uploaded objects; 0 (and a line saying so) if it cannot be scraped."""
    error = ""
    for _ in range(3):
        try:
            return sidecar.scrape_metrics().get(UPLOADS_OK, 0.0)
        except Exception as exc:  # a sidecar that died on its own reports nothing
            error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)
    log(f"WARNING: the metrics of the sidecar in {sidecar.root} could not be read: {error}")
    return 0.0


def _registrations(node: Node) -> int:
    """Executor logs under the node's Spark work directory that show a registration."""
    n = 0
    for stderr in (node.root / "work").glob("app-*/*/stderr"):
        with contextlib.suppress(OSError):
            if EXECUTOR_REGISTERED in stderr.read_text(errors="replace"):
                n += 1
    return n


@dataclass(slots=True)
class _Outage:
    """The node down now: killed, then its worker starting, then its executor joining."""

    event: KillEvent
    node: Node
    #: executor registrations in the node's work directory before the kill
    registered: int
    state: str = "down"  # -> "starting" -> "joining"
    deadline: float = 0.0


class Run:
    """The loop of one node count: batches watched, nodes killed and restarted on schedule.

    One node at most is down at a time: a kill that falls due while the
    previous victim is not back yet (its executor registered with the driver)
    is deferred to the third batch planned after it is back. No kill falls
    in the last ``max(2, kill_every_batches // 2)`` batches.
    """

    def __init__(self, cfg: BenchConfig, nodes: int, s3: SeaweedS3, work: Path, log: Log) -> None:
        self.cfg = cfg
        self.n = nodes
        self.s3 = s3
        self.work = work
        self.say = log
        self.rng = random.Random(cfg.seed * 1000 + nodes)
        self.prefix = f"cluster{nodes}-{uuid.uuid4().hex[:8]}"
        self.phases = Phases()
        self.phases_file = work / "phases.txt"
        self.kills: list[KillEvent] = []
        self.uploads: dict[str, float] = {}
        self.driver_exits: list[DriverExit] = []
        self.outage: _Outage | None = None
        #: the batch whose planning arms the next kill, and the kill's moment once armed
        self.next_kill = cfg.kill_every_batches if cfg.kill_every_batches > 0 else cfg.batches
        self.kill_at: float | None = None
        self.deferred = False
        self.due_batch: int | None = None

    def tag(self, msg: str) -> None:
        self.say(f"[{self.n} nodes] {msg}")

    def run(self) -> NodeCountResult:
        cfg = self.cfg
        t0 = time.monotonic()
        write_input(self.work / "input", cfg.batches, cfg.rows, cfg.keys)
        driver_sidecar = ServerProcess(
            self.work / "driver-sidecar",
            storage=self.s3.storage_url(self.prefix),
            extra_args=self.s3.server_args(),
            env=self.s3.env(),
        )
        error = ""
        with (
            driver_sidecar,
            SparkCluster(
                self.work / "cluster",
                self.s3,
                self.prefix,
                workers=self.n,
                jvm_options=cfg.jvm_options,
            ) as cluster,
        ):
            up_s = time.monotonic() - t0
            self.uploads = {node.name: 0.0 for node in cluster.nodes}
            self.tag(f"cluster up in {up_s:.1f} s: master {cluster.master_url}, {self.n} workers")
            try:
                self._drive(cluster, driver_sidecar)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                self.tag(f"FAILED: {error}")
                print(cluster.diagnostics(), flush=True)
            for node in cluster.nodes:
                proc = node.sidecar.proc
                if proc is not None and proc.poll() is None:
                    self.uploads[node.name] += _uploads(node.sidecar, self.tag)
            driver_uploads = _uploads(driver_sidecar, self.tag)
        want = expected_outputs(cfg.batches, cfg.rows, cfg.keys, self._groups())
        got = read_outputs(self.work / "out")
        missing, unexpected, sample = compare(want, got)
        return NodeCountResult(
            nodes=self.n,
            batches=cfg.batches,
            phases=self.phases,
            kills=self.kills,
            uploads=self.uploads,
            driver_uploads=driver_uploads,
            missing_rows=missing,
            unexpected_rows=unexpected,
            mismatch_sample=sample,
            expected_rows=sum(want.values()),
            driver_exits=self.driver_exits,
            wall_s=time.monotonic() - t0,
            cluster_up_s=up_s,
            error=error,
        )

    # ------------------------------------------------------------------ loop
    def _start_driver(self, cluster: SparkCluster, sidecar: ServerProcess) -> Driver:
        cfg = self.cfg
        return Driver(
            self.work,
            cluster,
            sidecar.address,
            until_files=cfg.batches,
            parallelism=cfg.parallelism,
            phases_file=self.phases_file,
            # the stall timeout bounds every batch; this only bounds the whole run
            timeout_s=cfg.stall_timeout_s + cfg.batches * 60.0,
        )

    def _drive(self, cluster: SparkCluster, sidecar: ServerProcess) -> None:
        cfg = self.cfg
        driver = self._start_driver(cluster, sidecar)
        self.tag(f"driver started (log {driver.log})")
        try:
            progress_at = time.monotonic()
            while True:
                if self._poll():
                    progress_at = time.monotonic()
                if self._all_input_recorded():
                    break
                self._restart_step(cluster)
                self._kill_step(cluster)
                rc = driver.poll()
                if rc is not None:
                    self._poll()
                    if self._all_input_recorded():
                        break
                    exit_ = DriverExit(rc, self.phases.last_recorded, driver.tail())
                    self.driver_exits.append(exit_)
                    self.tag(f"driver exited with {rc} after batch {exit_.last_recorded}")
                    if len(self.driver_exits) > cfg.max_driver_restarts:
                        raise RuntimeError(f"the driver exited {len(self.driver_exits)} times")
                    driver = self._start_driver(cluster, sidecar)
                    self.tag(f"driver restarted (log {driver.log})")
                    progress_at = time.monotonic()
                if time.monotonic() - progress_at > cfg.stall_timeout_s:
                    raise TimeoutError(
                        f"no batch recorded in {cfg.stall_timeout_s:.0f} s "
                        f"(last {self.phases.last_recorded}):\n{driver.tail()}"
                    )
                time.sleep(0.1)
            if self.outage is not None:
                self.tag(f"{self.outage.node.name}: the job ended before it was back")
            rc = driver.wait(timeout_s=180.0)
            if rc != 0:
                self.driver_exits.append(DriverExit(rc, self.phases.last_recorded, driver.tail()))
                self.tag(f"driver exited with {rc} after the last batch")
            self.tag("driver done")
        finally:
            driver.kill()

    def _groups(self) -> list[range]:
        """The input files each batch Spark committed read (see loadtest.spark_offsets)."""
        return file_groups(spark_checkpoint(self.work))

    def _all_input_recorded(self) -> bool:
        """Every input file is in a batch Spark committed and dstl recorded.

        Not "batch ``batches - 1`` recorded": a driver killed while Spark plans
        a batch makes the next run's first batch read two files, and then that
        batch never exists.
        """
        groups = self._groups()
        return (
            bool(groups)
            and groups[-1].stop == self.cfg.batches
            and self.phases.last_recorded >= len(groups) - 1
        )

    def _poll(self) -> bool:
        """Read new phase lines, print one line per recorded batch; True if any was recorded."""
        recorded = False
        for phase, b, t in self.phases.poll(self.phases_file):
            if phase != "recorded":
                continue
            recorded = True
            ph = self.phases
            span = t - ph.planned.get(b, t)
            ckpt = t - ph.tasks_done.get(b, t)
            prev = ph.recorded.get(b - 1)
            cycle = f"{t - prev:5.2f} s" if prev is not None else "  -    "
            self.tag(
                f"batch {b} ({b + 1}/{self.cfg.batches}) recorded: batch {cycle}, "
                f"planned->recorded {span:5.2f} s, checkpoint {ckpt * 1000:6.0f} ms"
            )
        return recorded

    def _kill_step(self, cluster: SparkCluster) -> None:
        """Arm the next kill once its batch is planned; fire it at its moment."""
        cfg = self.cfg
        ph = self.phases
        if self.kill_at is None:
            if self.deferred or self.next_kill not in ph.planned:
                return
            if self.next_kill > cfg.batches - 1 - max(2, cfg.kill_every_batches // 2):
                return  # too close to the end to see the recovery
            if self.outage is not None:
                self.tag(
                    f"kill due at batch {self.next_kill} deferred: "
                    f"{self.outage.node.name} is not back yet"
                )
                self.deferred = True  # re-armed by _back
                self.due_batch = self.next_kill
                return
            spans = [
                ph.recorded[b] - ph.planned[b]
                for b in ph.recorded
                if b in ph.planned and b >= cfg.warmup_batches
            ]
            # a random point of the batch: in its tasks, its sink or its checkpoint
            delay = self.rng.uniform(0.0, statistics.median(spans) if spans else 1.0)
            self.kill_at = ph.planned[self.next_kill] + delay
        if time.time() < self.kill_at:
            return
        batch = self.next_kill
        into = time.time() - ph.planned[batch]
        victim = self.rng.choice([node for node in cluster.nodes if node.alive])
        event = KillEvent(
            victim.name,
            batch,
            killed_at=0.0,
            uploads_before=_uploads(victim.sidecar, self.tag),
            due_batch=self.due_batch,
        )
        self.due_batch = None
        registered = _registrations(victim)
        event.killed_at = time.time()
        cluster.kill_node(victim)
        self.kills.append(event)
        self.uploads[victim.name] += event.uploads_before
        self.outage = _Outage(
            event, victim, registered, deadline=event.killed_at + cfg.restart_after_s
        )
        self.tag(
            f"kill {victim.name} (SIGKILL: worker, executor, Python workers, sidecar) "
            f"{into:.2f} s into batch {batch}; its sidecar had uploaded "
            f"{event.uploads_before:.0f} objects"
        )
        self.kill_at = None
        self.next_kill = batch + cfg.kill_every_batches

    def _restart_step(self, cluster: SparkCluster) -> None:
        """Move the node down now through restart, worker registration and executor rejoin."""
        o = self.outage
        if o is None:
            return
        now = time.time()
        if o.state == "down":
            if now < o.deadline:
                return
            self.tag(f"restart {o.node.name}: a new sidecar and worker")
            o.node = cluster.start_node_again(o.node)
            o.state, o.deadline = "starting", time.time() + START_TIMEOUT_S
        elif o.state == "starting":
            if cluster.worker_registered(o.node):
                o.event.restarted_at = now
                o.state, o.deadline = "joining", now + EXECUTOR_WAIT_S
                self.tag(
                    f"{o.node.name}: worker registered with the master "
                    f"{now - o.event.killed_at:.1f} s after the kill"
                )
            elif now > o.deadline:
                raise TimeoutError(f"the restarted worker of {o.node.name} did not register")
        elif o.state == "joining":
            if _registrations(o.node) > o.registered:
                o.event.rejoined_at = now
                self.tag(
                    f"{o.node.name}: executor registered with the driver "
                    f"{now - o.event.killed_at:.1f} s after the kill"
                )
                self._back()
            elif now > o.deadline:
                self.tag(f"{o.node.name}: no executor within {EXECUTOR_WAIT_S:.0f} s; going on")
                self._back()

    def _back(self) -> None:
        """The victim is back: a deferred kill is armed for a few batches later."""
        self.outage = None
        if self.deferred:
            self.deferred = False
            self.next_kill = max(self.phases.planned, default=0) + DEFERRED_KILL_GAP
            self.tag(f"deferred kill armed for batch {self.next_kill}")
