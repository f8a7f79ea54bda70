"""The Markdown report (and a PNG plot when matplotlib is importable)."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

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


def plot(results: dict[str, ConfigResult], path: Path) -> bool:
    """Latency CDF per configuration and objects per checkpoint; False without matplotlib."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results.values():
        xs = sorted(r.latencies_ms)
        if xs:
            ax1.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=r.name)
    ax1.set_xscale("log")
    ax1.set_xlabel("persist latency (ms)")
    ax1.set_ylabel("fraction of persists")
    ax1.legend()
    ax2.bar(list(results), [r.objects_per_ckpt for r in results.values()])
    ax2.set_ylabel("objects per checkpoint")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


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
    plotted = plot(results, png)
    if not plotted:
        print("[tree-bench] matplotlib is not importable: no plot", flush=True)
    settings = {k: v for k, v in asdict(cfg).items()}
    lines = [
        f"# Forwarding-tree benchmark {stamp}",
        "",
        f"K={cfg.nodes} sidecars on 127.0.0.1, W={cfg.writers} writers each, one SeaweedFS; "
        f"a checkpoint every {cfg.interval_s:g} s ({cfg.changes_per_checkpoint} changes of "
        f"{cfg.change_bytes} B per writer), {cfg.duration_s:g} s measured per configuration "
        f"after {cfg.warmup_rounds} warm-up round(s). Persist delay of a node = "
        f"{cfg.leaf_delay_ms:g} ms + {cfg.level_step_ms:g} ms x its height in the tree; "
        "a node without children flushes as soon as all its writers wait, a parent "
        + (
            "holds one idle writer so it flushes on its delay, with its children's forwards. "
            if cfg.idle_writer
            else "has no idle writer. "
        )
        + "Writers are threads of the driver process; all processes share this machine's "
        f"{os.cpu_count()} CPU(s). "
        "Objects/ckpt: distinct object keys in the handles of one round; PUTs/ckpt: "
        "`dstl_uploads_total` over all sidecars (PutObject at the proxy for the fault "
        "configuration) per round, warm-up included; PUTs/month: PUTs/ckpt / K x 100 nodes, "
        "one flush per second, 30 days.",
        "",
        table(results),
        "## CPU and memory",
        "",
        usage_table(results),
        "## Goals",
        "",
        *[f"- {'PASS' if ok else 'MISS'}: {line}" for ok, line in checks],
        "",
        f"![plot]({png.name})" if plotted else "(no plot: matplotlib is not installed)",
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
