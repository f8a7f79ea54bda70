"""A Spark standalone cluster on loopback, one ``dstl-server`` per worker ("node").

Started from the pyspark wheel (``bin/spark-class``): one Master and N
Workers, each Worker with its own sidecar process (its own port and object
prefix on the shared SeaweedFS), its own Spark work directory and its own
node-local state directory; the Worker's environment carries
``DSTL_ADDRESS`` and ``DSTL_STATE_DIR``, so the executors it launches (and
their Python workers) reach their own node's sidecar, as a DaemonSet's pods
would. Every process binds 127.0.0.1; the web UIs listen on loopback on
ports the OS picks. Each Worker runs in its own process group with its
executors, so :meth:`SparkCluster.kill_node` (SIGKILL) takes a whole node
down at once: worker, executors, Python workers and its sidecar.

``jvm_options`` (default ``""``: the JVM's own defaults, what the benchmarks
measure) go to every JVM of the cluster: the Master's and the Workers'
(``SPARK_DAEMON_JAVA_OPTS``, and ``SPARK_LAUNCHER_OPTS`` for the short-lived
launcher JVM of ``spark-class``), and through
:class:`~loadtest.cluster_bench.driver.Driver` to each job driver
(``spark.driver.extraJavaOptions``) and the executors it asks the workers for
(``spark.executor.extraJavaOptions``). The tests pass their light options
(the client compiler only, the serial collector).

:meth:`SparkCluster.close` stops everything it started, also when a test
fails (use it as a context manager).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"
START_TIMEOUT_S = 120.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _wait_for_log(path: Path, proc: subprocess.Popen[bytes], what: str, pattern: str) -> str:
    """The first line of ``path`` containing ``pattern`` (bounded wait; the process must live)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if pattern in line or re.search(pattern, line):
                    return line
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(path)}")
        time.sleep(0.2)
    raise TimeoutError(f"{what} not up after {START_TIMEOUT_S:.0f}s:\n{_tail(path)}")


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "<no log>"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


@dataclass
class Node:
    """One worker node: a Spark Worker (with its executors) and its sidecar."""

    name: str
    root: Path
    sidecar: ServerProcess
    worker: subprocess.Popen[bytes] | None = None
    alive: bool = False

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def log(self) -> Path:
        return self.root / f"worker-{self.sidecar.root.name}.log"


@dataclass
class SparkCluster:
    """Master + ``workers`` nodes; see the module docstring."""

    root: Path
    s3: SeaweedS3
    s3_prefix: str
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    sidecar_args: list[str] = field(default_factory=list)
    #: options for every JVM of the cluster and its jobs ("": the JVM's defaults)
    jvm_options: str = ""
    nodes: list[Node] = field(default_factory=list)
    master_url: str = ""
    _master: subprocess.Popen[bytes] | None = None

    # ----------------------------------------------------------- lifecycle
    def __enter__(self) -> SparkCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _env(self, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
            # the Worker's JVM and its executors: small heaps, several on 2 cores
            "SPARK_DAEMON_MEMORY": "256m",
        }
        if self.jvm_options:
            env["SPARK_DAEMON_JAVA_OPTS"] = self.jvm_options
            env["SPARK_LAUNCHER_OPTS"] = self.jvm_options
        env.pop("DSTL_ADDRESS", None)
        env.pop("DSTL_STATE_DIR", None)
        env.update(extra)
        return env

    def _spark_class(self, *args: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=log.parent,
                start_new_session=True,  # its own process group: killed as a whole
            )

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.root / "master.log"
        self._master = self._spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--webui-port",
            "0",
            log=log,
            env=self._env(),
        )
        # the nodes' sidecars start while the master's JVM boots
        for i in range(self.workers):
            self.nodes.append(self._new_node(f"node{i}", self.root / f"node{i}", "sidecar"))
        line = _wait_for_log(log, self._master, "the Spark master", _MASTER_URL.pattern)
        m = _MASTER_URL.search(line)
        assert m is not None
        self.master_url = m.group(1)
        for node in self.nodes:
            self._start_worker(node)
        for node in self.nodes:
            self._wait_worker(node)

    def _new_node(self, name: str, root: Path, sidecar_dir: str) -> Node:
        sidecar = ServerProcess(
            root / sidecar_dir,
            storage=self.s3.storage_url(self.s3_prefix),
            extra_args=[*self.s3.server_args(), *self.sidecar_args],
            env=self.s3.env(),
        )
        sidecar.start()
        return Node(name, root, sidecar)

    def _start_worker(self, node: Node) -> None:
        work = node.root / "work"
        work.mkdir(parents=True, exist_ok=True)
        node.state_dir.mkdir(parents=True, exist_ok=True)
        env = self._env(
            DSTL_ADDRESS=node.sidecar.address,
            DSTL_STATE_DIR=str(node.state_dir),
            SPARK_WORKER_DIR=str(work),
        )
        node.worker = self._spark_class(
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--webui-port",
            "0",
            "--cores",
            str(self.worker_cores),
            "--memory",
            self.worker_memory,
            "--work-dir",
            str(work),
            self.master_url,
            log=node.log,
            env=env,
        )

    def _wait_worker(self, node: Node) -> None:
        assert node.worker is not None
        _wait_for_log(node.log, node.worker, f"the Spark worker of {node.name}", _REGISTERED)
        node.alive = True

    # ------------------------------------------------------------- faults
    def kill_node(self, node: Node) -> None:
        """SIGKILL the node: its worker, executors and Python workers, and its sidecar."""
        if node.worker is not None:
            _kill_group(node.worker)
        node.sidecar.kill()
        node.alive = False

    def restart_node(self, node: Node) -> Node:
        """A fresh node in place of a killed one: a new sidecar (new port), a new worker.

        Its node-local state directory is kept, as a node's disk would be
        after a reboot; its Spark work directory too.
        """
        index = self.nodes.index(node)
        fresh = self._new_node(node.name, node.root, f"sidecar-{time.monotonic_ns()}")
        try:
            self._start_worker(fresh)
            self._wait_worker(fresh)
        except BaseException:
            # not in self.nodes yet: close() would not find it
            self.kill_node(fresh)
            raise
        self.nodes[index] = fresh
        return fresh

    def start_node_again(self, node: Node) -> Node:
        """:meth:`restart_node` without waiting for the new worker's registration.

        The fresh node (a new sidecar, already serving, and a new worker,
        starting) takes the killed one's place at once, so :meth:`close`
        stops it whatever happens; it is ``alive`` once
        :meth:`worker_registered` has seen the registration.
        """
        index = self.nodes.index(node)
        fresh = self._new_node(node.name, node.root, f"sidecar-{time.monotonic_ns()}")
        self.nodes[index] = fresh
        self._start_worker(fresh)
        return fresh

    def worker_registered(self, node: Node) -> bool:
        """Whether the node's worker has registered with the master (no waiting).

        Marks the node ``alive`` when it has; raises if the worker exited first.
        """
        if node.alive:
            return True
        if node.worker is None:
            return False
        if node.log.exists() and _REGISTERED in node.log.read_text(errors="replace"):
            node.alive = True
            return True
        if node.worker.poll() is not None:
            raise RuntimeError(
                f"the Spark worker of {node.name} exited with {node.worker.returncode}:\n"
                f"{_tail(node.log)}"
            )
        return False

    # --------------------------------------------------------------- stop
    def close(self) -> None:
        for node in self.nodes:
            if node.worker is not None:
                _kill_group(node.worker)
            with contextlib.suppress(Exception):
                node.sidecar.stop()
        if self._master is not None:
            _kill_group(self._master)

    def diagnostics(self) -> str:
        """Log tails of the master, every worker and the newest app's executors (INFO lines
        dropped), for a failing test's message."""
        parts = [f"--- master\n{_tail(self.root / 'master.log')}"]
        for node in self.nodes:
            parts.append(f"--- {node.name} worker\n{_tail(node.log)}")
            apps = sorted((node.root / "work").glob("app-*"))
            for stderr in sorted(apps[-1].glob("*/stderr")) if apps else ():
                lines = stderr.read_text(errors="replace").splitlines()
                kept = "\n".join(line for line in lines if " INFO " not in line)
                parts.append(f"--- {node.name} executor {stderr.parent.name}\n{kept[-4000:]}")
        return "\n".join(parts)
