"""Latency figures from HdrHistograms, and the progress line."""

from __future__ import annotations

from collections.abc import Sequence

from hdrh.histogram import HdrHistogram

from loadtest.baseline import new_latency_histogram
from loadtest.writer_proc import WriterResult


def ms(us: float) -> float:
    return round(us / 1000.0, 3)


def percentiles(hist: HdrHistogram) -> dict[str, float]:
    """p50/p99/p999/max/mean in milliseconds."""
    if hist.get_total_count() == 0:
        return {"p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0, "mean": 0.0, "count": 0}
    return {
        "p50": ms(hist.get_value_at_percentile(50)),
        "p99": ms(hist.get_value_at_percentile(99)),
        "p999": ms(hist.get_value_at_percentile(99.9)),
        "max": ms(hist.get_max_value()),
        "mean": ms(hist.get_mean_value()),
        "count": int(hist.get_total_count()),
    }


def persist_histogram(results: Sequence[WriterResult]) -> HdrHistogram:
    """Every writer's persist latencies in one histogram (microseconds)."""
    hist = new_latency_histogram()
    for r in results:
        for us in r.persist_latencies_us:
            hist.record_value(max(1, us))
    return hist


def say(msg: str) -> None:
    print(msg, flush=True)
