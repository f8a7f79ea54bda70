"""The sidecar processes of one configuration, started level by level, and their CPU/RSS."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from dstl_server.testing import ServerProcess
from loadtest.tree_bench.config import BenchConfig, TreeShape


@contextlib.contextmanager
def sidecars(
    cfg: BenchConfig,
    shape: TreeShape,
    root: Path,
    storage: str,
    s3_args: list[str],
    env: dict[str, str],
) -> Iterator[list[ServerProcess]]:
    """K ``dstl-server`` processes on 127.0.0.1; every one is stopped on exit, even on error.

    Parents start before their children (a child needs its parent's address);
    the nodes of one level start in parallel.
    """
    procs: list[ServerProcess | None] = [None] * shape.nodes
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=8) as pool:
        for level in shape.levels():
            started = []
            for i in level:
                args = [*s3_args, "--persist-delay-ms", f"{shape.delay_ms(i, cfg):g}"]
                p = shape.parent(i)
                if p is not None:
                    parent = procs[p]
                    assert parent is not None
                    args += ["--parent", parent.address, "--forward-timeout-s", "5"]
                proc = ServerProcess(root / f"node-{i}", storage=storage, extra_args=args, env=env)
                stack.callback(proc.__exit__, None, None, None)  # registered before start
                procs[i] = proc
                started.append(pool.submit(proc.start))
            for f in started:
                f.result()
        yield [p for p in procs if p is not None]


@dataclass(slots=True)
class ProcUsage:
    """CPU (percent of one core, averaged over the measured window) and peak RSS of one process."""

    name: str
    cpu_pct: float
    rss_mb: float


class UsageSampler:
    """Samples the RSS of some processes every ``period_s`` in a thread; CPU from cpu_times."""

    def __init__(self, pids: dict[str, int], period_s: float = 0.5) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.period_s = period_s
        self.peak_rss = dict.fromkeys(pids, 0)
        self._cpu0: dict[str, float] = {}
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="usage-sampler")

    def _cpu(self, p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return float(t.user + t.system)
        except psutil.Error:
            return 0.0

    def _sample(self) -> None:
        for name, p in self.procs.items():
            with contextlib.suppress(psutil.Error):
                self.peak_rss[name] = max(self.peak_rss[name], p.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> UsageSampler:
        self._t0 = time.monotonic()
        self._cpu0 = {name: self._cpu(p) for name, p in self.procs.items()}
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def result(self) -> list[ProcUsage]:
        """Usage from ``__enter__`` until now (call before the processes stop)."""
        self._sample()
        wall = max(1e-6, time.monotonic() - self._t0)
        return [
            ProcUsage(
                name,
                100.0 * (self._cpu(p) - self._cpu0[name]) / wall,
                self.peak_rss[name] / 2**20,
            )
            for name, p in self.procs.items()
        ]
