"""The state API benchmark's PNG, drawn with the shared helpers of :mod:`loadtest.plots`.

Three panels, every time axis logarithmic (the engines lie two orders of
magnitude apart): (a) the median batch time per engine (horizontal bars, the
names beside them), p90 in the label;
(b) the batch time per batch; (c) the state's checkpoint per batch against the
keys in state. Pure: typed records in, one PNG out; call from one thread.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.plots import (
    FIGSIZE,
    EngineBatches,
    PlotInputError,
    _finite,
    _p90,
    _require,
    _save,
    plain_log_axis,
    pyplot,
)


@dataclass(frozen=True, slots=True)
class EnginePlot:
    """One engine's batch times and state checkpoint times (ms) by batch. Frozen."""

    batches: EngineBatches
    #: the state's checkpoint per batch (NaN where the engine gave none), as ``batch_ids``
    state_commit_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.state_commit_ms) != len(self.batches.batch_ids):
            raise PlotInputError(
                f"engine {self.batches.label!r}: {len(self.batches.batch_ids)} batches but "
                f"{len(self.state_commit_ms)} checkpoint times"
            )


def duration(ms: float) -> str:
    """``ms`` as a short label: ``240 ms``, ``14.6 s``."""
    return f"{ms:,.0f} ms" if ms < 1000 else f"{ms / 1000:,.1f} s"


def draw_api_bench(
    engines: Sequence[EnginePlot], keys_after: Sequence[int], path: Path, title: str = ""
) -> Path:
    """Draw the three panels for ``engines``; ``keys_after[b]``: keys in state after batch b."""
    _require(engines, "engines")
    for e in engines:
        _finite(e.batches.batch_ms, f"engine {e.batches.label!r}")
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator  # type: ignore[import-not-found,unused-ignore]

    fig, (ax1, ax2, ax3) = plt.subplots(
        1, 3, figsize=(FIGSIZE[0] * 2, FIGSIZE[1]), width_ratios=(1.25, 1, 1)
    )
    try:
        medians = [statistics.median(e.batches.measured_ms) for e in engines]
        p90s = [_p90(e.batches.measured_ms) for e in engines]
        rows = range(len(engines))[::-1]  # the first engine on top
        bars = ax1.barh(rows, medians, color=[f"C{i}" for i in range(len(engines))])
        ax1.bar_label(
            bars,
            labels=[
                f" {duration(m)} (p90 {duration(p)})" for m, p in zip(medians, p90s, strict=True)
            ],
            fontsize="x-small",
        )
        ax1.set_yticks(list(rows), [e.batches.label for e in engines], fontsize="x-small")
        ax1.set_xscale("log")
        plain_log_axis(ax1.xaxis)
        ax1.set_xlim(min(medians) / 2, max(medians) * 5)
        ax1.set_xlabel("batch time, median (ms, log)")
        ax1.grid(True, which="both", axis="x", alpha=0.3)
        warm = max(e.batches.warmup for e in engines)
        ax1.set_title(
            f"(a) median after {warm} warm-up batch{'es' if warm > 1 else ''}"
            if warm
            else "(a) median"
        )
        for i, e in enumerate(engines):
            b = e.batches
            name = b.label.replace("\n", " ")
            ax2.plot(b.batch_ids, b.batch_ms, marker="o", markersize=3, color=f"C{i}", label=name)
            pts = [
                (keys_after[bid], ms)
                for bid, ms in zip(b.batch_ids, e.state_commit_ms, strict=True)
                if ms == ms and ms > 0 and bid < len(keys_after)
            ]
            if pts:
                ax3.plot(*zip(*pts, strict=True), marker="o", markersize=3, color=f"C{i}")
        ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax2.set_xlabel("micro-batch (state grows with each)")
        ax2.set_ylabel("batch time (ms, log)")
        ax2.set_title("(b) per batch")
        ax3.set_xlabel("keys in state after the batch")
        ax3.set_ylabel("state checkpoint / commit (ms, log)")
        ax3.set_title("(c) state checkpoint against state size")
        for ax in (ax2, ax3):
            ax.set_yscale("log")
            plain_log_axis(ax.yaxis)
            ax.grid(True, which="both", axis="y", alpha=0.3)
        handles, labels = ax2.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(engines), fontsize="small")
        return _save(fig, path, title, bottom=0.08)
    finally:
        plt.close(fig)
