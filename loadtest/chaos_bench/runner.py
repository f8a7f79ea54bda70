"""One round of the chaos bench: a fresh cluster and job, its schedule injected, the output checked.

:class:`Round` writes the round's input, starts a driver-node sidecar and a
2-node :class:`~loadtest.spark_cluster.SparkCluster` whose sidecars (and the
driver's checkpoint records) reach SeaweedFS through the fault proxy, starts
the job's driver (:class:`~loadtest.cluster_bench.driver.Driver` running
:mod:`loadtest.chaos_bench.job`) and then polls every 0.1 s:

* new phase lines (``planned``/``recorded`` per batch);
* the S3 windows: opened once their batch is planned and their moment has
  come, closed after their duration; the proxy holds the union of the open
  ones (:func:`~loadtest.chaos_bench.faults.proxy_faults`);
* the process faults, one at a time: the next fires once its batch is
  planned, its moment has come and the previous one has *recovered* (the
  killed process started again and a batch recorded after that); one that
  comes due while another is not recovered fires at the batch after the
  recovery. A fault still pending within the schedule's last batches is
  skipped (reported);
* a driver that exited without being killed (the job gave up under the
  faults): counted, and a new driver started (up to
  ``max_unplanned_exits``).

The round ends once every input file is in a batch Spark committed and dstl
recorded; its output is then compared with the failure-free expectation of
those batches (:func:`loadtest.chaos_bench.workload.expected_outputs`).
Every process the round started is stopped when it ends, whatever happens.
Single-threaded: the caller's thread runs everything.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.chaos_bench.config import ChaosConfig
from loadtest.chaos_bench.faults import kill_executors, proxy_faults, sidecar_again
from loadtest.chaos_bench.schedule import DRIVER_NODE, Fault, FaultKind, Schedule
from loadtest.chaos_bench.workload import (
    batch_watermarks,
    expected_outputs,
    read_outputs,
    write_input,
)
from loadtest.cluster_bench.driver import Driver, Phases, spark_checkpoint
from loadtest.cluster_bench.workload import compare
from loadtest.s3fault import FaultConfig, FaultProxyProcess
from loadtest.spark_cluster import START_TIMEOUT_S, Node, SparkCluster
from loadtest.spark_offsets import file_groups

JOB_MODULE = "loadtest.chaos_bench.job"
POLL_S = 0.1
#: a fault fires at most this long after its batch was planned
MAX_DELAY_S = 10.0
Log = Callable[[str], None]


@dataclass(slots=True)
class Injection:
    """One fault of the schedule as it went (unix times; 0: did not happen)."""

    fault: Fault
    fired_at: float = 0.0
    #: the batch planned last when it fired
    fired_batch: int = -1
    #: it came due while another fault was not recovered, and fired later
    deferred: bool = False
    #: the killed process started again / the S3 window closed
    restarted_at: float = 0.0
    #: a batch recorded after the restart
    recovered_at: float = 0.0
    skipped: str = ""

    @property
    def fired(self) -> bool:
        return self.fired_at > 0


@dataclass(slots=True)
class DriverExit:
    """A driver that exited on its own before the round's end (a new one was started)."""

    returncode: int
    last_recorded: int
    tail: str


@dataclass(slots=True)
class RoundResult:
    """What one round did and found; :mod:`loadtest.chaos_bench.report` prints it."""

    schedule: Schedule
    injections: list[Injection]
    driver_exits: list[DriverExit] = field(default_factory=list)
    #: requests the proxy faulted this round, by its fault names (503, reset, latency)
    proxy_faults: dict[str, int] = field(default_factory=dict)
    #: requests that went through the proxy this round
    proxy_requests: int = 0
    batches: int = 0
    expected_rows: int = 0
    late_rows: int = 0
    ambiguous_rows: int = 0
    missing_rows: int = 0
    unexpected_rows: int = 0
    mismatch_sample: str = ""
    wall_s: float = 0.0
    error: str = ""
    work: Path | None = None

    @property
    def passed(self) -> bool:
        return (
            not self.error
            and self.batches > 0
            and self.missing_rows == 0
            and self.unexpected_rows == 0
        )

    def injected(self) -> Counter[FaultKind]:
        return Counter(i.fault.kind for i in self.injections if i.fired)


@dataclass(slots=True)
class _Active:
    """The process fault in progress: down, then started again, then recovered."""

    injection: Injection
    state: str = "down"  # -> "starting" (a node's worker) -> "up" (waiting for a batch)
    deadline: float = 0.0
    node: Node | None = None


class Round:
    """One round (see the module docstring); :meth:`run` returns its :class:`RoundResult`."""

    #: the job's driver now (set by :meth:`_drive`)
    driver: Driver

    def __init__(
        self,
        cfg: ChaosConfig,
        schedule: Schedule,
        s3: SeaweedS3,
        proxy: FaultProxyProcess,
        work: Path,
        log: Log,
    ) -> None:
        self.cfg = cfg
        self.schedule = schedule
        self.s3 = s3  # the view through the proxy
        self.proxy = proxy
        self.work = work
        self.say = log
        self.prefix = f"chaos{schedule.round}-{uuid.uuid4().hex[:8]}"
        self.phases = Phases()
        self.phases_file = work / "phases.txt"
        self.last_recorded_at = 0.0
        self.parallelism = schedule.parallelism
        self.injections = [Injection(f) for f in schedule.faults]
        self.pending = [i for i in self.injections if not i.fault.is_s3]
        self.windows = [i for i in self.injections if i.fault.is_s3]
        self.open: list[Injection] = []
        self.active: _Active | None = None
        #: the batch after which a deferred process fault may fire
        self.not_before = -1
        self.driver_exits: list[DriverExit] = []
        self.driver_sidecar: ServerProcess | None = None
        self.sidecars: list[ServerProcess] = []  # every sidecar started here, to stop

    def tag(self, msg: str) -> None:
        self.say(f"[round {self.schedule.round}] {msg}")

    # ----------------------------------------------------------------- run
    def run(self) -> RoundResult:
        cfg = self.cfg
        t0 = time.monotonic()
        self.work.mkdir(parents=True, exist_ok=True)
        write_input(self.work / "input", cfg.batches, cfg.rows, cfg.keys)
        result = RoundResult(self.schedule, self.injections, self.driver_exits, work=self.work)
        self.proxy.set_faults({})
        self.proxy.reset_stats()
        try:
            with contextlib.ExitStack() as stack:
                stack.callback(self._stop_sidecars)
                self.driver_sidecar = self._sidecar(self.work / "driver-sidecar")
                cluster = stack.enter_context(
                    SparkCluster(
                        self.work / "cluster",
                        self.s3,
                        self.prefix,
                        workers=cfg.nodes,
                        jvm_options=cfg.jvm_options,
                    )
                )
                self.tag(f"cluster up: master {cluster.master_url}, {cfg.nodes} workers")
                try:
                    self._drive(cluster)
                except Exception as exc:
                    result.error = f"{type(exc).__name__}: {exc}"
                    self.tag(f"FAILED: {result.error}")
                    print(cluster.diagnostics(), flush=True)
        finally:
            with contextlib.suppress(Exception):
                self.proxy.set_faults({})
            with contextlib.suppress(Exception):
                stats = self.proxy.stats()
                result.proxy_faults = dict(stats.get("faults", {}))
                result.proxy_requests = int(stats.get("requests", 0))
        result.wall_s = time.monotonic() - t0
        if not result.error:
            self._check(result)
        return result

    def _sidecar(self, root: Path) -> ServerProcess:
        sidecar = ServerProcess(
            root,
            storage=self.s3.storage_url(self.prefix),
            extra_args=self.s3.server_args(),
            env=self.s3.env(),
        )
        self.sidecars.append(sidecar)
        return sidecar.start()

    def _stop_sidecars(self) -> None:
        for s in self.sidecars:
            with contextlib.suppress(Exception):
                s.stop(10.0)

    def _check(self, result: RoundResult) -> None:
        cfg = self.cfg
        groups = file_groups(spark_checkpoint(self.work))
        files = [f for g in groups for f in g]
        if files != list(range(cfg.batches)):
            result.error = f"Spark's committed batches do not read every file once: {groups}"
            return
        marks = batch_watermarks(spark_checkpoint(self.work), len(groups))
        if marks != sorted(marks):
            result.error = f"the watermarks of the committed batches go back: {marks}"
            return
        want = expected_outputs(groups, marks, cfg.rows, cfg.keys)
        got = read_outputs(self.work / "out")
        missing, unexpected, sample = compare(want.outputs, got)
        result.batches = len(groups)
        result.expected_rows = sum(want.outputs.values())
        result.late_rows = want.late_rows
        result.ambiguous_rows = want.ambiguous_rows
        result.missing_rows, result.unexpected_rows = missing, unexpected
        result.mismatch_sample = sample

    # ---------------------------------------------------------------- loop
    def _start_driver(self, cluster: SparkCluster) -> Driver:
        cfg = self.cfg
        assert self.driver_sidecar is not None
        return Driver(
            self.work,
            cluster,
            self.driver_sidecar.address,
            until_files=cfg.batches,
            parallelism=self.parallelism,
            phases_file=self.phases_file,
            timeout_s=cfg.stall_timeout_s + cfg.batches * 60.0,
            module=JOB_MODULE,
        )

    def _drive(self, cluster: SparkCluster) -> None:
        cfg = self.cfg
        self.driver = self._start_driver(cluster)
        self.tag(f"driver started, parallelism {self.parallelism} (log {self.driver.log})")
        try:
            progress_at = time.monotonic()
            while True:
                if self._poll():
                    progress_at = time.monotonic()
                if self._all_input_recorded():
                    break
                self._windows_step()
                self._process_step(cluster)
                if self._driver_exited(cluster):
                    progress_at = time.monotonic()
                if time.monotonic() - progress_at > cfg.stall_timeout_s:
                    raise TimeoutError(
                        f"no batch recorded in {cfg.stall_timeout_s:.0f} s "
                        f"(last {self.phases.last_recorded}):\n{self.driver.tail()}"
                    )
                time.sleep(POLL_S)
            for i in self.open:
                i.restarted_at = time.time()
            self.open.clear()
            self.proxy.set_faults({})
            for inj in self.injections:
                if not inj.fired:
                    inj.skipped = inj.skipped or "the job ended first"
            rc = self.driver.wait(timeout_s=180.0)
            if rc != 0:
                raise RuntimeError(f"the last driver exited with {rc}:\n{self.driver.tail()}")
            self.tag("driver done")
        finally:
            self.driver.kill()

    def _all_input_recorded(self) -> bool:
        groups = file_groups(spark_checkpoint(self.work))
        return (
            bool(groups)
            and groups[-1].stop == self.cfg.batches
            and self.phases.last_recorded >= len(groups) - 1
        )

    def _poll(self) -> bool:
        recorded = False
        for phase, b, t in self.phases.poll(self.phases_file):
            if phase == "recorded":
                recorded = True
                self.last_recorded_at = max(self.last_recorded_at, t)
                self.tag(f"batch {b} recorded")
        return recorded

    def _moment(self, fault: Fault, batch: int) -> float | None:
        """When a fault armed at ``batch`` fires (unix time); None while it is not planned."""
        ph = self.phases
        planned = [b for b in ph.planned if b >= batch]
        if not planned:
            return None
        # batch 0 carries the executors' start-up: left out; a slow median is capped
        spans = [ph.recorded[b] - ph.planned[b] for b in ph.recorded if b > 0 and b in ph.planned]
        median = min(statistics.median(spans), MAX_DELAY_S) if spans else 1.0
        return ph.planned[min(planned)] + fault.delay_frac * median

    @property
    def _planned_last(self) -> int:
        return max(self.phases.planned, default=-1)

    def _too_late(self, batch: int) -> bool:
        return batch >= self.cfg.batches - self.cfg.end_margin

    # ---------------------------------------------------------- S3 windows
    def _windows_step(self) -> None:
        now = time.time()
        changed = False
        for inj in list(self.open):
            if now >= inj.fired_at + inj.fault.duration_s:
                inj.restarted_at = inj.recovered_at = now
                self.open.remove(inj)
                changed = True
                self.tag(f"S3 window closed: {inj.fault.kind}")
        for inj in self.windows:
            if inj.fired or inj.skipped:
                continue
            at = self._moment(inj.fault, inj.fault.at_batch)
            if at is None or now < at:
                continue
            inj.fired_at, inj.fired_batch = now, self._planned_last
            self.open.append(inj)
            changed = True
            self.tag(f"S3 window opened at batch {inj.fired_batch}: {inj.fault.describe()}")
        if changed:
            config: FaultConfig = proxy_faults(i.fault for i in self.open)
            self.proxy.set_faults(config)

    # ------------------------------------------------------ process faults
    def _process_step(self, cluster: SparkCluster) -> None:
        if self.active is not None:
            self._advance(cluster, self.active)
            return
        if not self.pending:
            return
        inj = self.pending[0]
        batch = max(inj.fault.at_batch, self.not_before)
        if self._too_late(batch) or self._too_late(self._planned_last):
            self.pending.pop(0)
            inj.skipped = f"too close to the end (due at batch {batch})"
            self.tag(f"skipped {inj.fault.kind}: {inj.skipped}")
            return
        at = self._moment(inj.fault, batch)
        if at is None or time.time() < at:
            return
        if self._fire(cluster, inj):
            self.pending.pop(0)

    def _node(self, cluster: SparkCluster, name: str) -> Node:
        return next(n for n in cluster.nodes if n.name == name)

    def _fire(self, cluster: SparkCluster, inj: Injection) -> bool:
        """Inject one process fault; False if it cannot be done yet (retried next poll)."""
        f = inj.fault
        into = f"at batch {self._planned_last}"
        active = _Active(inj)
        if f.kind is FaultKind.SIDECAR_KILL:
            if f.target == DRIVER_NODE:
                assert self.driver_sidecar is not None
                self.driver_sidecar.kill()
            else:
                self._node(cluster, f.target).sidecar.kill()
            active.deadline = time.time() + self.cfg.sidecar_down_s
            self.tag(f"SIGKILL the sidecar of {f.target} {into}")
        elif f.kind is FaultKind.EXECUTOR_KILL:
            killed = kill_executors(self._node(cluster, f.target))
            if not killed:
                return False  # no executor there yet: try again
            active.state = "up"
            inj.restarted_at = time.time()
            self.tag(f"SIGKILL the executor of {f.target} (and its Python workers) {into}")
        elif f.kind is FaultKind.NODE_KILL:
            node = self._node(cluster, f.target)
            if not node.alive:
                return False
            cluster.kill_node(node)
            active.node = node
            active.deadline = time.time() + self.cfg.node_down_s
            self.tag(f"SIGKILL node {f.target} (worker, executor, Python workers, sidecar) {into}")
        else:  # driver kill, rescale
            self.driver.kill()
            active.deadline = time.time() + self.cfg.driver_down_s
            if f.kind is FaultKind.RESCALE:
                self.parallelism = f.parallelism
            self.tag(f"SIGKILL the driver {into} ({f.describe()})")
        inj.fired_at, inj.fired_batch = time.time(), self._planned_last
        inj.deferred = self.not_before > f.at_batch
        self.active = active
        return True

    def _advance(self, cluster: SparkCluster, a: _Active) -> None:
        f, inj, now = a.injection.fault, a.injection, time.time()
        if a.state == "down":
            if now < a.deadline:
                return
            if f.kind is FaultKind.SIDECAR_KILL:
                self._sidecar_again(cluster, f.target)
                a.state = "up"
            elif f.kind is FaultKind.NODE_KILL:
                assert a.node is not None
                a.node = cluster.start_node_again(a.node)
                a.state, a.deadline = "starting", now + START_TIMEOUT_S
                self.tag(f"{f.target}: a new sidecar and worker")
            else:
                self.driver = self._start_driver(cluster)
                a.state = "up"
                self.tag(
                    f"driver started again on a fresh disk, parallelism {self.parallelism} "
                    f"(log {self.driver.log})"
                )
            inj.restarted_at = time.time()
        elif a.state == "starting":
            assert a.node is not None
            if cluster.worker_registered(a.node):
                a.state = "up"
                inj.restarted_at = now
                self.tag(f"{f.target}: worker registered {now - inj.fired_at:.1f} s after the kill")
            elif now > a.deadline:
                raise TimeoutError(f"the restarted worker of {f.target} did not register")
        elif self.last_recorded_at > inj.restarted_at:
            inj.recovered_at = now
            self.active = None
            self.not_before = self._planned_last + 1
            self.tag(f"recovered from {f.kind} {now - inj.fired_at:.1f} s after it")

    def _sidecar_again(self, cluster: SparkCluster, target: str) -> None:
        if target == DRIVER_NODE:
            assert self.driver_sidecar is not None
            self.driver_sidecar = sidecar_again(self.driver_sidecar, self.s3)
            self.sidecars.append(self.driver_sidecar)
            address = self.driver_sidecar.address
        else:
            node = self._node(cluster, target)
            node.sidecar = sidecar_again(node.sidecar, self.s3)  # cluster.close() stops it
            address = node.sidecar.address
        self.tag(f"sidecar of {target} started again on {address}")

    def _driver_exited(self, cluster: SparkCluster) -> bool:
        """A driver nobody killed exited: record it, start another; True if it did."""
        a = self.active
        if (
            a is not None
            and a.state == "down"
            and a.injection.fault.kind
            in (
                FaultKind.DRIVER_KILL,
                FaultKind.RESCALE,
            )
        ):
            return False  # killed on purpose; started again by _advance
        rc = self.driver.poll()
        if rc is None:
            return False
        self._poll()
        if self._all_input_recorded():
            return False
        exit_ = DriverExit(rc, self.phases.last_recorded, self.driver.tail())
        self.driver_exits.append(exit_)
        self.tag(f"the driver exited with {rc} after batch {exit_.last_recorded} (unplanned)")
        if len(self.driver_exits) > self.cfg.max_unplanned_exits:
            raise RuntimeError(
                f"the driver exited {len(self.driver_exits)} times on its own; the last:\n"
                f"{exit_.tail}"
            )
        self.driver.kill()
        self.driver = self._start_driver(cluster)
        self.tag(f"driver started again (log {self.driver.log})")
        return True
