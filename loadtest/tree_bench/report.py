"""The Markdown report (and a PNG plot when matplotlib is importable)."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from loadtest.plots import DPI, attempt, plain_log_axis, pyplot
from loadtest.tree_bench.config import BenchConfig
from loadtest.tree_bench.runner import ConfigResult


def table(results: dict[str, ConfigResult]) -> str:
    head = (
        "| config | fan-out | depth | delays ms (root..leaf) | rounds | persists "
        "| objects/ckpt (max) | PUTs/ckpt | bucket objects | p50 ms | p99 ms | p99.9 ms "
        "| max ms | MB/s | upload MB/s | fallbacks | PUTs/month, 100 nodes |\n"
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: |\n"
    )
    rows = [
        f"| {r.name} | {r.fanout or '-'} | {r.depth} | {r.delays_ms} | {r.rounds} | {r.persists} "
        f"| {r.objects_per_ckpt:.2f} ({r.objects_per_ckpt_max}) | {r.puts_per_ckpt:.2f} "
        f"| {r.bucket_objects} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.p999_ms:.1f} "
        f"| {r.max_ms:.1f} | {r.mb_s:.2f} | {r.upload_mb_s:.2f} | {r.forward_fallbacks} "
        f"| {r.puts_month_100:,.0f} |"
        for r in results.values()
    ]
    return head + "\n".join(rows) + "\n"


def usage_table(results: dict[str, ConfigResult]) -> str:
    lines = ["| config | process | CPU % of a core | peak RSS MiB |", "| --- | --- | ---: | ---: |"]
    for r in results.values():
        for u in r.usage:
            lines.append(f"| {r.name} | {u.name} | {u.cpu_pct:.1f} | {u.rss_mb:.0f} |")
    return "\n".join(lines) + "\n"


def flush_table(results: dict[str, ConfigResult]) -> str:
    """Flushes over every sidecar by trigger: which released the objects (warm-up included)."""
    names = sorted({t for r in results.values() for t in r.flush_triggers})
    if not names:
        return "(no flush counts scraped)\n"
    lines = [
        "| config | " + " | ".join(names) + " |",
        "| --- | " + " | ".join("---:" for _ in names) + " |",
    ]
    for r in results.values():
        cells = " | ".join(str(r.flush_triggers.get(t, 0)) for t in names)
        lines.append(f"| {r.name} | {cells} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, ConfigResult], path: Path, title: str = "") -> str | None:
    """Persist latency CDF per configuration (a) and objects per checkpoint (b) as one PNG.

    Returns None once written, else why not (matplotlib missing, or the
    drawing failed): the report says so and the run still succeeds.
    """
    return attempt(lambda: _draw(results, path, title))


def _draw(results: dict[str, ConfigResult], path: Path, title: str) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    try:
        for r in results.values():
            xs = sorted(r.latencies_ms)
            if xs:
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                ax1.step(xs, ys, where="post", label=f"{r.name} (p99 {r.p99_ms:.0f} ms)")
        ax1.set_xscale("log")
        plain_log_axis(ax1.xaxis)
        ax1.set_xlabel("persist latency (ms, log)")
        ax1.set_ylabel("fraction of persists")
        ax1.set_ylim(0, 1.01)
        ax1.axhline(0.99, color="grey", linewidth=0.6, linestyle=":")
        ax1.grid(True, which="both", alpha=0.3)
        ax1.legend(loc="lower right", fontsize="small")
        ax1.set_title("(a) persist latency CDF")
        names = list(results)
        means = [r.objects_per_ckpt for r in results.values()]
        peaks = [r.objects_per_ckpt_max for r in results.values()]
        bars = ax2.bar(names, means, color="tab:blue")
        labels = [f"{m:.2f} (max {p})" for m, p in zip(means, peaks, strict=True)]
        ax2.bar_label(bars, labels=labels)
        ax2.set_ylabel("objects per checkpoint (mean)")
        ax2.set_ylim(0, max([*means, 1.0]) * 1.15)
        ax2.grid(True, axis="y", alpha=0.3)
        ax2.set_title("(b) objects per checkpoint")
        if title:
            fig.suptitle(title, fontsize="medium")
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)


def write_report(
    cfg: BenchConfig,
    results: dict[str, ConfigResult],
    checks: list[tuple[bool, str]],
    report_dir: Path,
    stamp: str,
) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"tree-{stamp}.md"
    png = report_dir / f"tree-{stamp}.png"
    title = (
        f"K={cfg.nodes} sidecars x W={cfg.writers} writers, a checkpoint every "
        f"{cfg.interval_s:g} s, {cfg.duration_s:g} s per configuration"
        + (", idle writer on parents" if cfg.idle_writer else "")
        + f" ({stamp})"
    )
    why_not = plot(results, png, title)
    if why_not is not None:
        print(f"[tree-bench] no plot: {why_not}", flush=True)
    settings = {k: v for k, v in asdict(cfg).items()}
    lines = [
        f"# Forwarding-tree benchmark {stamp}",
        "",
        f"K={cfg.nodes} sidecars on 127.0.0.1, W={cfg.writers} writers each, one SeaweedFS; "
        f"a checkpoint every {cfg.interval_s:g} s ({cfg.changes_per_checkpoint} changes of "
        f"{cfg.change_bytes} B per writer), {cfg.duration_s:g} s measured per configuration "
        f"after {cfg.warmup_rounds} warm-up round(s). Persist delay (a cap) of a node = "
        f"{cfg.leaf_delay_ms:g} ms + {cfg.level_step_ms:g} ms x its height in the tree; "
        "a node flushes as soon as all its writers wait and, with children, every child "
        "known to forward for the job has forwarded, or at its persist delay. "
        + (
            "Every parent also holds one idle writer (`--idle-writer`, the old workaround), "
            "so it flushes on its delay only. "
            if cfg.idle_writer
            else ""
        )
        + "Writers are threads of one process per node; all processes share this machine's "
        f"{os.cpu_count()} CPU(s). "
        "Objects/ckpt: distinct object keys in the handles of one round; PUTs/ckpt: "
        "`dstl_uploads_total` over all sidecars (PutObject at the proxy for the fault "
        "configuration) per round, warm-up included; PUTs/month: PUTs/ckpt / K x 100 nodes, "
        "one flush per second, 30 days.",
        "",
        f"![objects and latency per configuration]({png.name})"
        if why_not is None
        else f"(no plot: {why_not})",
        "",
        table(results),
        "## Flushes by trigger",
        "",
        "Over every sidecar, warm-up included: `all_waiting` = every writer and known child "
        "in, `delay` = the persist delay (cap) ran out, `size` = the size threshold.",
        "",
        flush_table(results),
        "## CPU and memory",
        "",
        usage_table(results),
        "## Goals",
        "",
        *[f"- {'PASS' if ok else 'MISS'}: {line}" for ok, line in checks],
        "",
        "## Settings",
        "",
        "```",
        *[f"{k} = {v!r}" for k, v in settings.items()],
        "```",
        "",
    ]
    path.write_text("\n".join(lines))
    return path
