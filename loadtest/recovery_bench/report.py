"""Tables, goals and the Markdown report of the recovery benchmark."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from loadtest.plots import (
    RestoreCurve,
    Series,
    attempt,
    curves_to_json,
    draw_restore_vs_tail,
    draw_tail_ratio_sweep,
)
from loadtest.recovery_bench.config import (
    DEFAULT_TAIL_RATIO,
    GOAL_MAT_MB_S,
    GOAL_TAIL_RATIO,
    ISSUE_KEYS,
    BenchConfig,
)
from loadtest.recovery_bench.runner import (
    DstlResult,
    RatioPoint,
    RatioRestore,
    RecordRestores,
    goal_parallelism,
)
from loadtest.recovery_bench.spark_job import SparkResult


def _full(dstl: DstlResult) -> RecordRestores | None:
    return next((r for r in dstl.restores if r.kind == "full"), None)


def restore_table(cfg: BenchConfig, dstl: DstlResult) -> str:
    lines = [
        "| restore from | p | one subtask (s) | one MB/s | whole job (s) | job MB/s "
        "| rows read | changes replayed | MB read | job / full snapshot |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    full = _full(dstl)
    for r in dstl.restores:
        for p in cfg.restore_parallelisms:
            one, job = r.one[p], r.job[p]
            ratio = f"{job.seconds / full.job[p].seconds:.2f}x" if full is not None else ""
            lines.append(
                f"| {r.label} | {p} | {one.seconds:.2f} | {one.mb_per_s:.1f} | {job.seconds:.2f} "
                f"| {job.mb_per_s:.1f} | {job.rows:,} | {job.replayed:,} | {job.bytes / 1e6:.1f} "
                f"| {ratio} |"
            )
    return "\n".join(lines) + "\n"


def mat_table(dstl: DstlResult) -> str:
    lines = [
        "| materialization (batch) | subtasks | stored MB | longest upload (s) "
        "| per subtask (s) | node MB/s | batch wall (s) |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    if dstl.job is not None:
        for m in dstl.job.materializations:
            lines.append(
                f"| {m.batch_id} | {len(m.seconds)} | {m.total_bytes / 1e6:.1f} "
                f"| {max(m.seconds):.2f} | {', '.join(f'{s:.2f}' for s in m.seconds)} "
                f"| {m.node_mb_per_s:.1f} | {m.wall_s:.2f} |"
            )
    return "\n".join(lines) + "\n"


def sweep_points(cfg: BenchConfig, dstl: DstlResult) -> list[RatioPoint]:
    """The sweep, ascending, with "off" (ratio 0: the main job, by time only) first."""
    p = goal_parallelism(cfg)
    full = _full(dstl)
    points = list(dstl.sweep)
    if full is not None and dstl.job is not None:
        at = {
            r.tail: RatioRestore(r.tail, r.segments, r.share, r.job[p].seconds)
            for r in dstl.restores
            if r.kind == "tail" and r.tail > 0
        }
        worst = at.get(cfg.max_tail)
        points.insert(0, RatioPoint(0.0, at, worst, full.job[p].seconds, dstl.job))
    return points


def _x(ratio: float) -> str:
    return f"{ratio:g}" if ratio > 0 else "off"


def sweep_table(cfg: BenchConfig, dstl: DstlResult) -> str:
    """Per ratio: restore / full snapshot at each tail and at the longest, upload per checkpoint."""
    points = sweep_points(cfg, dstl)
    if not points:
        return ""
    off = points[0].job.upload_per_checkpoint(cfg.max_tail) if points[0].ratio == 0 else None
    rounds = sorted({t for pt in points for t in pt.at})
    lines = [
        "| materialize_tail_ratio | "
        + " | ".join(f"after round {t}" for t in rounds)
        + " | longest tail (round, share of state) | full snapshot (s) "
        "| materializations | MB uploaded per checkpoint | vs off |",
        "| ---: | " + "---: | " * len(rounds) + "---: | ---: | ---: | ---: | ---: |",
    ]
    for pt in points:
        cells = [f"{pt.at[t].seconds / pt.full_s:.2f}x" if t in pt.at else "" for t in rounds]
        w = pt.worst
        worst = f"{w.seconds / pt.full_s:.2f}x ({w.round}, {w.share:.2f})" if w else "n/a"
        up = pt.job.upload_per_checkpoint(cfg.max_tail)
        vs = f"{up / off:.1f}x" if off else ""
        mark = " (default)" if pt.ratio == DEFAULT_TAIL_RATIO else ""
        lines.append(
            f"| {_x(pt.ratio)}{mark} | {' | '.join(cells)} | {worst} | {pt.full_s:.2f} "
            f"| {pt.job.update_mats} | {up / 1e6:.2f} | {vs} |"
        )
    return "\n".join(lines) + "\n"


def sweep_series(cfg: BenchConfig, dstl: DstlResult) -> tuple[list[Series], list[Series]]:
    """The sweep's plot: restore / full (longest tail, each round) and MB per checkpoint."""
    points = sweep_points(cfg, dstl)
    restore = [
        Series(
            "longest tail the ratio allows",
            tuple(pt.ratio for pt in points if pt.worst),
            tuple(pt.worst.seconds / pt.full_s for pt in points if pt.worst),
        )
    ]
    for t in sorted({t for pt in points for t in pt.at}):
        restore.append(
            Series(
                f"after round {t}",
                tuple(pt.ratio for pt in points if t in pt.at),
                tuple(pt.at[t].seconds / pt.full_s for pt in points if t in pt.at),
            )
        )
    upload = [
        Series(
            f"over {cfg.max_tail} checkpoints",
            tuple(pt.ratio for pt in points),
            tuple(pt.job.upload_per_checkpoint(cfg.max_tail) / 1e6 for pt in points),
        )
    ]
    return [s for s in restore if s.xs], upload


def default_goal(cfg: BenchConfig, dstl: DstlResult) -> tuple[bool, str] | None:
    """Restore with the default settings within GOAL_TAIL_RATIO x full, and what it uploads."""
    points = sweep_points(cfg, dstl)
    pt = next((x for x in points if x.ratio == DEFAULT_TAIL_RATIO), None)
    if pt is None or not pt.at:
        return None
    quotients = {t: r.seconds / pt.full_s for t, r in sorted(pt.at.items())}
    off = points[0] if points[0].ratio == 0 else None
    up = pt.job.upload_per_checkpoint(cfg.max_tail)
    extra = ""
    if off is not None and pt is not off:
        base = off.job.upload_per_checkpoint(cfg.max_tail)
        extra = (
            f"; it uploads {up / 1e6:.2f} MB per checkpoint against {base / 1e6:.2f} MB by "
            f"time only (+{(up - base) / 1e6:.2f} MB, {up / base:.1f}x: "
            f"{pt.job.update_mats} materializations in {cfg.max_tail} checkpoints)"
        )
    worst = (
        f"; the longest tail it allows ({pt.worst.share:.2f} of the state, round "
        f"{pt.worst.round}): {pt.worst.seconds / pt.full_s:.2f}x"
        if pt.worst is not None and pt is not off
        else ""
    )
    return (
        all(q <= GOAL_TAIL_RATIO for q in quotients.values()),
        f"restore with the default settings (materialize_tail_ratio={_x(DEFAULT_TAIL_RATIO)}) "
        + ", ".join(
            f"after a changelog tail of {t} checkpoints: {q:.2f}x" for t, q in quotients.items()
        )
        + f" the full-snapshot restore ({pt.full_s:.2f} s), whole job at p={goal_parallelism(cfg)} "
        f"(goal <= {GOAL_TAIL_RATIO:g}x){worst}{extra}",
    )


def cache_label(cfg: BenchConfig) -> str:
    """Where the restores ran, by the sidecar's read cache."""
    if cfg.read_cache_bytes is None:
        return "read cache (writer's node)"
    if cfg.read_cache_bytes == 0:
        return "no read cache (another node)"
    return f"read cache {cfg.read_cache_bytes / 2**20:g} MiB"


def restore_curves(cfg: BenchConfig, dstl: DstlResult) -> list[RestoreCurve]:
    """Whole-job restore time against the tail, one curve per restore parallelism,
    each with the full snapshot's restore of the same state as its reference."""
    tails = [r for r in dstl.restores if r.kind == "tail"]
    full = _full(dstl)
    return [
        RestoreCurve(
            f"p={p}, {cache_label(cfg)}",
            tuple(r.tail for r in tails),
            tuple(r.job[p].seconds for r in tails),
            None if full is None else full.job[p].seconds,
        )
        for p in cfg.restore_parallelisms
        if tails
    ]


def spark_table(spark: SparkResult) -> str:
    lines = [
        "| restart after | state load per partition (s) | of which snapshot (s) "
        "| of which changelog replay (s) | changelog files replayed | first batch (s) "
        "| start() to first batch done (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in spark.restores:
        p = r.partitions
        lines.append(
            f"| {r.tail} updates | {r.load_s:.2f} | {r.load_snapshot_sum_s / p:.2f} "
            f"| {r.replay_sum_s / p:.2f} | {r.replayed_files} | {r.first_batch_s:.2f} "
            f"| {r.restart_s:.2f} |"
        )
    return "\n".join(lines) + "\n"


def spark_note(cfg: BenchConfig, dstl: DstlResult, spark: SparkResult) -> str:
    """What Spark's figures mean next to dstl's (a paragraph)."""
    p = goal_parallelism(cfg)
    longest = next((r for r in dstl.restores if r.kind == "tail" and r.tail == cfg.max_tail), None)
    sr = next((r for r in spark.restores if r.tail == cfg.max_tail), None)
    if longest is None or sr is None:
        return ""
    warm = f"{spark.warm_batch_s:.2f} s" if spark.warm_batch_s else "n/a"
    return (
        f"Spark's state load is the time its stores took to become usable: with a snapshot "
        f"at hand it copies the snapshot's RocksDB files and opens the database (rows are "
        f"read lazily later), then replays the changelog files after it "
        f"({sr.replayed_files} here after {cfg.max_tail} updates). The whole first batch "
        f"after the restart took {sr.first_batch_s:.2f} s against {warm} for a batch that "
        f"restores nothing: much of that difference is likely the new JVM warming up (code "
        f"generation, class loading) rather than the state (this run does not separate "
        f"them). dstl's restore rebuilds every row "
        f"into the node-local SQLite store before the task runs: "
        f"{longest.job[p].seconds:.2f} s for the whole job at p={p} with a tail of "
        f"{cfg.max_tail}."
    )


def goals(cfg: BenchConfig, dstl: DstlResult, spark: SparkResult | None) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = []
    p = goal_parallelism(cfg)
    longest = next((r for r in dstl.restores if r.kind == "tail" and r.tail == cfg.max_tail), None)
    default = default_goal(cfg, dstl)
    if default is not None:
        out.append(default)
    if longest is not None and spark is not None:
        sr = next((r for r in spark.restores if r.tail == cfg.max_tail), None)
        if sr is not None:
            out.append(
                (
                    longest.job[p].seconds <= sr.load_s,
                    f"restore with a tail of {cfg.max_tail}: dstl {longest.job[p].seconds:.2f}"
                    f" s (whole job, p={p}, no tail ratio) vs Spark RocksDB state load "
                    f"{sr.load_s:.2f} s per partition after {cfg.max_tail} updates "
                    f"({sr.partitions} partitions; goal: no slower)",
                )
            )
    if dstl.job is not None and dstl.job.materializations:
        best = max(m.node_mb_per_s for m in dstl.job.materializations)
        out.append(
            (
                best >= GOAL_MAT_MB_S,
                f"materialization through one node: {best:.1f} MB/s "
                f"({cfg.job_parallelism} subtasks at once; goal >= {GOAL_MAT_MB_S:g} MB/s)",
            )
        )
    return out


def _machine() -> str:
    try:
        import pyspark

        spark = f", PySpark {pyspark.__version__}"
    except ImportError:  # pragma: no cover - pyspark is a dev dependency
        spark = ""
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}{spark}, "
        f"{platform.platform()}"
    )


def write_report(
    report_dir: Path,
    cfg: BenchConfig,
    dstl: DstlResult,
    spark: SparkResult | None,
    total_s: float,
    load: tuple[float, float],
    command: str,
) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"recovery-{stamp}.md"
    png = path.with_suffix(".png")
    job = dstl.job
    curves = restore_curves(cfg, dstl)
    path.with_suffix(".json").write_text(curves_to_json(curves))
    why_not = attempt(
        lambda: draw_restore_vs_tail(
            curves,
            png,
            f"{cfg.keys:,} keys of {cfg.value_bytes} B, {cfg.update_fraction:.1%} rewritten per "
            f"checkpoint; whole job; load average {load[0]:.1f} -> {load[1]:.1f} "
            f"on {os.cpu_count()} CPUs",
        )
    )
    sweep_png = path.with_name(f"{path.stem}-tail-ratio.png")
    restore_s, upload_s = sweep_series(cfg, dstl)
    sweep_why_not = attempt(
        lambda: draw_tail_ratio_sweep(
            restore_s,
            upload_s,
            sweep_png,
            f"materialize_tail_ratio: restore (whole job, p={goal_parallelism(cfg)}) and "
            f"upload; {cfg.keys:,} keys, {cfg.update_fraction:.1%} rewritten per checkpoint; "
            f"load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} CPUs",
            goal=GOAL_TAIL_RATIO,
            chosen=DEFAULT_TAIL_RATIO if DEFAULT_TAIL_RATIO > 0 else None,
        )
    )
    scaled = (
        ""
        if cfg.keys in ISSUE_KEYS
        else f" The issue asks for {' and '.join(f'{k:,}' for k in ISSUE_KEYS)} keys; this "
        f"run used {cfg.keys:,} (scaled to this machine: run `--keys 1000000` or "
        "`--keys 10000000` for the full sizes)."
    )
    parts = [
        f"# Recovery: restore from dstl vs a full snapshot vs Spark RocksDB ({stamp})",
        "",
        f"Command: `{command}`. Machine: {_machine()}. Whole run: {total_s:.0f} s; 1-minute "
        f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end. The machine is "
        "shared with other work (other test runs may have been going on): every figure is "
        "what this run measured, on 2 cores that the restoring processes share with the "
        "sidecar and SeaweedFS.",
        "",
        f"State: {cfg.keys:,} keys, one `ValueState` of {cfg.value_bytes} bytes each "
        f"({cfg.state_bytes / 1e6:.1f} MB of keys and values); each update checkpoint "
        f"rewrites {cfg.update_fraction:.1%} of the keys.{scaled}",
        "",
        "Settings: " + ", ".join(f"`{k}={v}`" for k, v in asdict(cfg).items()),
        "",
        "## How",
        "",
        "* **(a) dstl**: the keyed job runs the product's batch cycle (the coordinator "
        "plans and records each batch; each of its "
        f"{cfg.job_parallelism} subtasks runs `run_keyed` in its own process) against a real "
        "`dstl-server` on 127.0.0.1 whose objects go to a real S3 server (SeaweedFS on "
        "127.0.0.1). Load batches write every key; an empty batch materializes; then one "
        f"batch per update round. At tails {', '.join(str(t) for t in cfg.tails)} "
        "(checkpoints since the materialization) the job pauses and the record is restored "
        "by `restore_subtask` (what a task runs when its local store is not at the committed "
        "version) into fresh stores: subtask 0 alone, then every subtask at once (one "
        "process each, started together; the job's time is first start to last end).",
        "* **(b) full snapshot**: after the last update round an empty batch materializes "
        "again, so its record is the same state as the longest tail's, as materialized "
        "parts only (a tail of 0), restored by the same code.",
        "* **(c) Spark**: the same keys and values through a PySpark streaming aggregation "
        "(last value per key) on `RocksDBStateStoreProvider` with changelog checkpointing "
        "(other state store settings at their defaults: a snapshot every 10 versions), "
        f"`local[{cfg.job_parallelism}]`, {cfg.job_parallelism} shuffle partitions, one input "
        "file per micro-batch; each restart is a new process and JVM whose first micro-batch "
        "loads the state. Its load time is Spark's own metric (`rocksdbLoadLatencyMs`, "
        "summed over partitions in the progress, shown per partition); Spark's checkpoint is "
        "on the local file system (no S3 client in this PySpark), which favours Spark.",
        "",
        "MB = 10^6 bytes. Restore MB/s: payload bytes read (materialized rows and replayed "
        "changes) per second. Materialization MB/s: stored object bytes of every subtask over "
        "the longest subtask's upload (they upload at once, through the one sidecar).",
        "",
        "## Restore (dstl)",
        "",
        f"![restore time against the changelog tail]({png.name})"
        if why_not is None
        else f"(no plot: {why_not})",
        "",
        restore_table(cfg, dstl),
    ]
    if job is not None:
        parts += [
            f"Building the state: loading and the first materialization {job.load_s:.1f} s, "
            f"{cfg.max_tail} update checkpoints {job.update_s:.1f} s "
            f"({job.batches} batches, {job.logged_bytes / 1e6:.1f} MB of changes logged).",
            "",
            "## Materialization (dstl)",
            "",
            mat_table(dstl),
        ]
    if dstl.sweep:
        parts += [
            "## The materialization tail ratio (dstl)",
            "",
            f"The job again for each `materialize_tail_ratio` (off: the job above), restored "
            f"whole at p={goal_parallelism(cfg)} (best of {cfg.repeat}) after rounds "
            f"{', '.join(str(t) for t in cfg.tails if t > 0)} and from the first record whose "
            "tail outgrew the ratio (the longest tail it lets a restore replay; share: the "
            "tail's stored bytes over the materialized parts'), each against the full snapshot "
            "of its own state after the last round; and the stored bytes the update rounds "
            "uploaded (changelog and the materializations the ratio started) per checkpoint.",
            "",
            f"![restore and upload against the tail ratio]({sweep_png.name})"
            if sweep_why_not is None
            else f"(no plot: {sweep_why_not})",
            "",
            sweep_table(cfg, dstl),
        ]
    if spark is not None:
        parts += [
            "## Spark RocksDB (changelog checkpointing)",
            "",
            f"Loading {cfg.keys:,} keys: first batch {spark.load_s:.1f} s; state rows "
            f"{spark.state_rows:,}; checkpoint's state files {spark.checkpoint_bytes / 1e6:.1f}"
            " MB; a batch that restores nothing (an update round) takes "
            + (f"{spark.warm_batch_s:.2f} s (median)." if spark.warm_batch_s else "n/a."),
            "",
            spark_table(spark),
            spark_note(cfg, dstl, spark),
            "",
        ]
    gl = goals(cfg, dstl, spark)
    parts += ["## Goals", ""]
    parts += [f"- **{'PASS' if ok else 'MISS'}**: {line}" for ok, line in gl]
    parts.append("")
    path.write_text("\n".join(parts))
    return path
