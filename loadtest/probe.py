"""Watching the server from outside: its Prometheus metrics and its memory."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil
from prometheus_client.parser import text_string_to_metric_families

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Every sample of one scrape of ``/metrics``: (name, sorted labels) -> value."""

    samples: dict[SampleKey, float]

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(
            v for (n, lbl), v in self.samples.items() if n == name and want.issubset(set(lbl))
        )

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``{label value: value}`` of a labelled counter."""
        out: dict[str, float] = {}
        for (n, lbl), v in self.samples.items():
            if n == name:
                value = dict(lbl).get(label)
                if value is not None:
                    out[value] = out.get(value, 0.0) + v
        return out

    def minus(self, before: MetricsSnapshot) -> MetricsSnapshot:
        """The change since ``before`` (counters and histogram sums/counts)."""
        return MetricsSnapshot({k: v - before.samples.get(k, 0.0) for k, v in self.samples.items()})


def scrape(metrics_port: int, host: str = "127.0.0.1", timeout_s: float = 10.0) -> MetricsSnapshot:
    """Fetch and parse the server's ``/metrics`` page."""
    with urllib.request.urlopen(f"http://{host}:{metrics_port}/metrics", timeout=timeout_s) as r:
        text = r.read().decode()
    samples: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return MetricsSnapshot(samples)


@dataclass(slots=True)
class RssSampler:
    """Samples a process's resident set size and CPU time every ``interval_s``.

    ``samples`` holds ``(time.monotonic(), rss_bytes, cpu_seconds)``; bounded
    by the run time over the interval (a 10-minute run at 0.1 s is 6,000).
    """

    pid: int
    interval_s: float = 0.1
    samples: list[tuple[float, int, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> RssSampler:
        proc = psutil.Process(self.pid)

        def run() -> None:
            while not self._stop.is_set():
                try:
                    with proc.oneshot():
                        cpu = proc.cpu_times()
                        rss = int(proc.memory_info().rss)
                    self.samples.append((time.monotonic(), rss, cpu.user + cpu.system))
                except psutil.Error:
                    return  # the server went away; the bench notices elsewhere
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def window(self, start: float, end: float) -> list[int]:
        """RSS values sampled in ``[start, end]``."""
        return [rss for t, rss, _ in list(self.samples) if start <= t <= end]

    def cpu_cores(self, start: float, end: float) -> float:
        """Average CPU cores the process used between the samples inside ``[start, end]``."""
        inside = [(t, cpu) for t, _, cpu in list(self.samples) if start <= t <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    def peak(self) -> int:
        return max((rss for _, rss, _ in list(self.samples)), default=0)


@contextmanager
def sampling_rss(pid: int, interval_s: float = 0.1) -> Iterator[RssSampler]:
    """An :class:`RssSampler` running for the block."""
    sampler = RssSampler(pid, interval_s).start()
    try:
        yield sampler
    finally:
        sampler.stop()
