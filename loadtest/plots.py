"""The benchmarks' plots: pure functions, typed figures in, one PNG out.

Each ``draw_*`` function takes records built by a benchmark's report step
(nothing here reads a report, starts Spark or touches the network) and writes
one PNG at ``path`` (matplotlib's Agg backend: files only, no display). It
refuses input it cannot draw with a :class:`PlotInputError` naming what is
missing (no series, a series without points, x and y of different lengths, a
title line instead of data) and raises :class:`PlotUnavailable` when
matplotlib is not installed (it is in the ``bench`` extra). :func:`attempt`
wraps a draw for a report step: a plot is not worth failing a run of minutes
for, so it returns why not instead of raising.

Invariants: a drawn figure is always closed (pyplot keeps a process-wide
registry of open figures); the PNGs are small (``DPI`` = 100, about 800 x 480
pixels). Call from one thread at a time: pyplot's state is process-global.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: dots per inch of every PNG: 8 x 4.8 inches -> 800 x 480 pixels, tens of KB
DPI = 100
#: the figure size (inches) of one-panel plots; two panels use twice the width
FIGSIZE = (8.0, 4.8)
#: characters per line of a figure's title per inch of its width (longer titles wrap)
TITLE_CHARS_PER_INCH = 13


class PlotInputError(ValueError):
    """The figures given cannot be drawn (empty, or x and y do not pair up)."""


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a plot: ``ys[i]`` at ``xs[i]``, drawn in the order given. Frozen."""

    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys):
            raise PlotInputError(
                f"series {self.label!r}: {len(self.xs)} x values but {len(self.ys)} y values"
            )


@dataclass(frozen=True, slots=True)
class RestoreCurve:
    """Restore time against the changelog tail, with its full-snapshot reference. Frozen.

    ``seconds[i]`` is the restore from a materialization plus ``tails[i]``
    checkpoints of changelog; ``full_snapshot_s`` (if measured) the restore of
    the same state from a full snapshot, drawn as a dashed line of the same colour.
    """

    label: str
    tails: tuple[int, ...]
    seconds: tuple[float, ...]
    full_snapshot_s: float | None = None

    def __post_init__(self) -> None:
        if len(self.tails) != len(self.seconds):
            raise PlotInputError(
                f"curve {self.label!r}: {len(self.tails)} tails but {len(self.seconds)} times"
            )


@dataclass(frozen=True, slots=True)
class EngineBatches:
    """One engine's batch times (ms) by batch index; ``warmup`` first batches left out
    of the bar (median) but drawn in the per-batch panel. Frozen."""

    label: str
    batch_ids: tuple[int, ...]
    batch_ms: tuple[float, ...]
    warmup: int = 0

    def __post_init__(self) -> None:
        if len(self.batch_ids) != len(self.batch_ms):
            raise PlotInputError(
                f"engine {self.label!r}: {len(self.batch_ids)} batch ids but "
                f"{len(self.batch_ms)} times"
            )

    @property
    def measured_ms(self) -> list[float]:
        """The batch times after the warm-up (all of them if none is after it)."""
        after = [t for b, t in zip(self.batch_ids, self.batch_ms, strict=True) if b >= self.warmup]
        return after or list(self.batch_ms)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; :class:`PlotUnavailable` if not installed."""
    try:
        # typed when installed; the ignore is for `make typecheck` without the bench extra
        import matplotlib  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise PlotUnavailable("matplotlib is not installed (`pip install -e '.[bench]'`)") from exc
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    return plt


def log_label(v: float, _pos: int | None = None) -> str:
    """A log axis's major tick as a plain number (1, 10, 100, not 10^2)."""
    return f"{v:g}"


def log_minor_label(v: float, _pos: int | None = None) -> str:
    """Only 2x and 5x a power of ten: enough ticks on a log axis without crowding."""
    lead = f"{v:.0e}"[0]
    return f"{v:g}" if lead in "25" else ""


def plain_log_axis(axis: Any) -> None:
    """Label a log ``axis`` (``ax.xaxis`` / ``ax.yaxis``) with plain numbers."""
    from matplotlib.ticker import FuncFormatter  # type: ignore[import-not-found,unused-ignore]

    axis.set_major_formatter(FuncFormatter(log_label))
    axis.set_minor_formatter(FuncFormatter(log_minor_label))


def attempt(draw: Callable[[], object]) -> str | None:
    """Run ``draw``; None once it drew, else why not (for a report line, never raised)."""
    try:
        draw()
    except PlotUnavailable as exc:
        return str(exc)
    except Exception as exc:  # a plot is not worth failing a run of minutes for
        return f"the plot failed: {exc!r}"
    return None


def _require(items: Sequence[Any], what: str) -> None:
    if not items:
        raise PlotInputError(f"nothing to plot: no {what}")


def _finite(values: Sequence[float], what: str) -> None:
    if not values:
        raise PlotInputError(f"nothing to plot: {what} has no points")
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise PlotInputError(f"{what}: values must be finite, got {bad[:3]}")


def _save(fig: Any, path: Path, title: str, bottom: float = 0.0) -> Path:
    """Title, lay out (leaving ``bottom``, a share of the height, for a figure legend), write."""
    if title:
        # wrapped: suptitle does not, and a long caption would be cut at the edges
        fig.suptitle(
            "\n".join(textwrap.wrap(title, round(fig.get_figwidth() * TITLE_CHARS_PER_INCH))),
            fontsize="medium",
        )
    fig.tight_layout(rect=(0.0, bottom, 1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def draw_checkpoint_vs_state(
    series: Sequence[Series], path: Path, title: str = "", xlabel: str = "state size (MB)"
) -> Path:
    """Checkpoint time (ms, log scale) per batch, one colour per mode, in two panels:
    (a) against state size (MB), one point per batch (no lines: a store's reported
    size need not grow monotonically); (b) in batch order, as lines.

    ``series``: per mode, ``xs`` = state MB and ``ys`` = checkpoint ms of each
    batch, in batch order. A checkpoint of 0 ms (a store that reports whole
    milliseconds) is drawn at the axis floor rather than dropped. Returns ``path``.
    """
    _require(series, "series")
    for s in series:
        _finite(s.xs, f"series {s.label!r}")
        _finite(s.ys, f"series {s.label!r}")
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(FIGSIZE[0] * 1.5, FIGSIZE[1]), sharey=True)
    try:
        positive = [y for s in series for y in s.ys if y > 0]
        floor = min(positive, default=1.0) / 2
        for i, s in enumerate(series):
            ys = [max(y, floor) for y in s.ys]
            ax1.plot(s.xs, ys, "o", markersize=4, color=f"C{i}", label=s.label)
            ax2.plot(range(len(ys)), ys, marker="o", markersize=3, color=f"C{i}", label=s.label)
        ax1.set_yscale("log")
        plain_log_axis(ax1.yaxis)
        ax1.set_xlabel(xlabel)
        ax1.set_ylabel("checkpoint time per batch (ms, log)")
        ax1.set_title("(a) against state size")
        ax2.set_xlabel("micro-batch")
        ax2.set_title("(b) per batch")
        for ax in (ax1, ax2):
            ax.grid(True, which="both", alpha=0.3)
        # below both panels: the points fill the panels' corners
        handles, labels = ax2.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(series), fontsize="small")
        return _save(fig, path, title, bottom=0.08)
    finally:
        plt.close(fig)


def draw_restore_vs_tail(curves: Sequence[RestoreCurve], path: Path, title: str = "") -> Path:
    """Restore time (s) against the changelog tail (checkpoints since the materialization).

    The tails are evenly spaced categories (0, 10, 100 read at a glance); each
    curve's full-snapshot restore is a dashed line of its colour. Returns ``path``.
    """
    _require(curves, "restore curves")
    for c in curves:
        _finite(c.seconds, f"curve {c.label!r}")
        if c.full_snapshot_s is not None:
            _finite([c.full_snapshot_s], f"curve {c.label!r} full snapshot")
    tails = sorted({t for c in curves for t in c.tails})
    where = {t: i for i, t in enumerate(tails)}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    try:
        top = 0.0
        for c in curves:
            (line,) = ax.plot(
                [where[t] for t in c.tails], c.seconds, marker="o", label=f"{c.label}: tail"
            )
            top = max(top, *c.seconds)
            if c.full_snapshot_s is not None:
                ax.axhline(
                    c.full_snapshot_s,
                    color=line.get_color(),
                    linestyle="--",
                    linewidth=1,
                    label=f"{c.label}: full snapshot",
                )
                top = max(top, c.full_snapshot_s)
        ax.set_xticks(range(len(tails)), [str(t) for t in tails])
        ax.set_xlabel("changelog tail (checkpoints since the materialization)")
        ax.set_ylabel("restore time (s)")
        ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        return _save(fig, path, title)
    finally:
        plt.close(fig)


def draw_tail_ratio_sweep(
    restore: Sequence[Series],
    upload: Sequence[Series],
    path: Path,
    title: str = "",
    *,
    goal: float | None = None,
    chosen: float | None = None,
) -> Path:
    """What a materialization tail ratio costs and buys, in two panels of one PNG:
    (a) restore time over the full snapshot's (``restore``: ``xs`` ratios, ``ys``
    the quotient), with ``goal`` as a dashed line; (b) uploaded MB per checkpoint
    (``upload``). A ratio of 0 is "off" (materialization by time only); ``chosen``
    (the default) is a dotted vertical line in both. Returns ``path``.
    """
    _require(restore, "restore series")
    _require(upload, "upload series")
    for s in (*restore, *upload):
        _finite(s.xs, f"series {s.label!r}")
        _finite(s.ys, f"series {s.label!r}")
    ratios = sorted({x for s in (*restore, *upload) for x in s.xs})
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(FIGSIZE[0] * 1.5, FIGSIZE[1]))
    try:
        for ax, series in ((ax1, restore), (ax2, upload)):
            for s in series:
                ax.plot(s.xs, s.ys, marker="o", label=s.label)
            if chosen is not None:
                ax.axvline(chosen, color="grey", linestyle=":", label=f"default {chosen:g}")
            ax.set_xticks(ratios, [f"{x:g}" if x > 0 else "off" for x in ratios])
            ax.set_xlabel("materialize_tail_ratio (replayed / materialized stored bytes)")
            ax.grid(True, alpha=0.3)
        if goal is not None:
            ax1.axhline(goal, color="red", linestyle="--", linewidth=1, label=f"goal {goal:g}x")
        ax1.set_ylim(0, max(max(s.ys) for s in restore) * 1.15)
        ax1.set_ylabel("restore time / full snapshot's")
        ax1.set_title("(a) restore")
        ax2.set_ylim(0, max(max(s.ys) for s in upload) * 1.15)
        ax2.set_ylabel("uploaded MB per checkpoint (changelog + materializations)")
        ax2.set_title("(b) upload")
        for ax in (ax1, ax2):
            ax.legend(fontsize="small")
        return _save(fig, path, title)
    finally:
        plt.close(fig)


def draw_batch_time_by_engine(
    engines: Sequence[EngineBatches], path: Path, title: str = ""
) -> Path:
    """(a) median batch time per engine (bars, p90 in the label); (b) batch time by batch.

    Returns ``path``.
    """
    _require(engines, "engines")
    for e in engines:
        _finite(e.batch_ms, f"engine {e.label!r}")
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(FIGSIZE[0] * 1.5, FIGSIZE[1]))
    try:
        medians = [statistics.median(e.measured_ms) for e in engines]
        p90s = [_p90(e.measured_ms) for e in engines]
        names = [e.label for e in engines]
        bars = ax1.bar(range(len(engines)), [m / 1000 for m in medians], color="tab:blue")
        for i, bar in enumerate(bars):
            bar.set_color(f"C{i}")
        ax1.bar_label(
            bars,
            labels=[
                f"{m / 1000:.1f} s (p90 {p / 1000:.1f})" for m, p in zip(medians, p90s, strict=True)
            ],
            fontsize="small",
        )
        ax1.set_xticks(range(len(engines)), names, fontsize="small")
        ax1.set_ylabel("batch time, median (s)")
        ax1.set_ylim(0, max(medians) / 1000 * 1.2 if max(medians) > 0 else 1.0)
        ax1.grid(True, axis="y", alpha=0.3)
        warm = max(e.warmup for e in engines)
        ax1.set_title(
            f"(a) median after {warm} warm-up batch{'es' if warm > 1 else ''}"
            if warm
            else "(a) median"
        )
        for i, e in enumerate(engines):
            ax2.plot(
                e.batch_ids,
                [t / 1000 for t in e.batch_ms],
                marker="o",
                color=f"C{i}",
                label=e.label,
            )
        ax2.set_xlabel("micro-batch (state grows with each)")
        ax2.set_ylabel("batch time (s)")
        ax2.set_ylim(bottom=0)
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize="small")
        ax2.set_title("(b) per batch")
        return _save(fig, path, title)
    finally:
        plt.close(fig)


def _p90(values: Sequence[float]) -> float:
    """The 0.9 quantile (nearest rank) of non-empty ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]


def curves_to_json(curves: Sequence[RestoreCurve]) -> str:
    """``curves`` as JSON text (saved beside a recovery report, to combine runs later)."""
    return json.dumps(
        [
            {
                "label": c.label,
                "tails": list(c.tails),
                "seconds": list(c.seconds),
                "full_snapshot_s": c.full_snapshot_s,
            }
            for c in curves
        ],
        indent=1,
    )


def curves_from_json(text: str) -> list[RestoreCurve]:
    """The curves :func:`curves_to_json` wrote; :class:`PlotInputError` if malformed."""
    try:
        raw = json.loads(text)
        return [
            RestoreCurve(
                str(c["label"]),
                tuple(int(t) for t in c["tails"]),
                tuple(float(s) for s in c["seconds"]),
                None if c.get("full_snapshot_s") is None else float(c["full_snapshot_s"]),
            )
            for c in raw
        ]
    except (ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, PlotInputError):
            raise
        raise PlotInputError(f"not a list of restore curves: {exc!r}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loadtest.plots restore-vs-tail OUT.png A.json [B.json ...] [--match p=2,]``: one plot of
    the restore curves saved by several recovery runs (say with and without the read cache)."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.plots",
        description="Combine the restore curves (recovery-*.json) of several recovery "
        "benchmark runs into one PNG.",
        allow_abbrev=False,
    )
    parser.add_argument("kind", choices=["restore-vs-tail"])
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("curves", type=Path, nargs="+", help="recovery-*.json files")
    parser.add_argument("--title", default="")
    parser.add_argument(
        "--match", default="", help="keep only the curves whose label contains this, e.g. p=2,"
    )
    ns = parser.parse_args(argv)
    curves = [c for f in ns.curves for c in curves_from_json(f.read_text()) if ns.match in c.label]
    print(draw_restore_vs_tail(curves, ns.out, ns.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
