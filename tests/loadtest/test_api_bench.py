"""The state API benchmark's own logic on synthetic figures (loadtest/api_bench): presets,
the engine process's JSON hand-back, progress parsing, the goals' PASS/MISS/N/A and the
report files. Fast: no Spark session, no server (the engines themselves run in
``make bench-api``)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.api_bench.cli import parse
from loadtest.api_bench.config import BenchConfig, preset
from loadtest.api_bench.figures import NAN, Batch, EngineRun, batch_of
from loadtest.api_bench.goals import goals, touched
from loadtest.api_bench.report import Report, write_report
from loadtest.api_bench.stats import EngineStats


def batch(i: int, ms: float, state_ms: float = 10.0, rw: float = NAN) -> Batch:
    return Batch(i, 100, 50, ms, ms, 1.0, state_ms, None, rw)


def run(engine: str, ms: float, n: int = 7, state_ms: float = 10.0) -> EngineRun:
    return EngineRun(engine, [batch(i, ms, state_ms) for i in range(n)], wall_s=1.0)


def test_presets_default_is_the_issues_job_and_large_reaches_a_million_keys() -> None:
    cfg, _ = parse([])
    assert (cfg.keys, cfg.rows, cfg.engines) == (100_000, 20_000, ("tws", "dstl", "vec", "jvm"))
    large, _ = parse(["--preset", "large"])
    assert large.keys == 1_000_000 and large.rows == 100_000
    assert large.new_per_batch * large.batches == 1_000_000
    assert large.new_per_batch < large.rows  # every batch also revisits earlier keys
    small, _ = parse(
        ["--preset", "large", "--keys", "3000", "--batches", "3", "--engines", "jvm,vec"]
    )
    assert (small.batches, small.keys, small.rows) == (3, 3000, 100_000)
    assert small.engines == ("vec", "jvm")  # in the order they run
    with pytest.raises(SystemExit):
        parse(["--engines", "nope"])


def test_config_and_runs_travel_between_processes_as_json() -> None:
    cfg = preset("large", batches=4)
    assert BenchConfig.from_json(cfg.to_json()) == cfg
    r = EngineRun("vec", [batch(0, 5.0, NAN, 2.5), batch(1, 4.0)], wall_s=3.0, error="x")
    back = EngineRun.from_json(json.loads(json.dumps(r.to_json())))
    assert back.engine == "vec" and back.error == "x" and back.wall_s == 3.0
    assert math.isnan(back.batches[0].state_commit_ms) and back.batches[0].state_rw_ms == 2.5
    assert back.batches[1].trigger_ms == 4.0 and math.isnan(back.batches[1].state_rw_ms)


def test_progress_of_each_kind_of_engine() -> None:
    p = {
        "batchId": 3,
        "numInputRows": 20,
        "durationMs": {"triggerExecution": 90, "addBatch": 70, "walCommit": 4, "commitOffsets": 6},
        "stateOperators": [{"commitTimeMs": 11, "numRowsTotal": 5}],
    }
    jvm = batch_of(p, "jvm", 9)
    assert (jvm.trigger_ms, jvm.log_ms, jvm.state_commit_ms, jvm.state_rows) == (90, 10, 11, 5)
    vec = batch_of(
        {**p, "dstl": {"checkpointDurationMs": 7, "stateReadMs": 2, "stateWriteMs": 3}}, "vec", 9
    )
    assert (vec.state_commit_ms, vec.state_rw_ms, vec.checkpoint_ms) == (7, 5, 17)
    bare = batch_of(p, "vec", 9)  # no figures from the engine: NaN, not 0
    assert math.isnan(bare.state_commit_ms) and math.isnan(bare.state_rw_ms)


def stats(*runs: EngineRun) -> list[EngineStats]:
    return [EngineStats.of(r, [100] * 7, (1.0, 1.0)) for r in runs]


def test_goals_pass_miss_and_not_measured() -> None:
    runs = [run("tws", 9000.0), run("dstl", 3000.0), run("vec", 150.0), run("jvm", 200.0)]
    got = goals(stats(*runs), runs, [100] * 7, [100 * (i + 1) for i in range(7)])
    ok = [g[0] for g in got]
    assert ok[:4] == [True, True, True, True]  # 60x, 20x, 0.75x the JVM, flat
    assert "beats it by 1.33x" in got[2][1]
    assert ok[5] is False  # the per-key processor: 3x < 10x
    slow = [run("vec", 500.0), run("jvm", 200.0)]
    got = goals(stats(*slow), slow, [100] * 7, [100] * 7)
    assert got[0][0] is None and got[1][0] is None  # no tws, no dstl
    assert got[2][0] is False and "2.50x" in got[2][1]


def test_touched_uses_the_engines_own_figures_else_the_batch_time() -> None:
    keys_after = [100_000 * (i + 1) for i in range(6)]
    grows = EngineRun("vec", [batch(i, 100.0, rw=10.0 * (i + 1)) for i in range(6)])
    ok, line = touched(grows, [1000] * 6, keys_after)
    assert (
        ok is False and "stateReadMs" in line and "state grew 3.7x" in line
    )  # 150 k -> 550 k keys (medians)
    flat = EngineRun("vec", [batch(i, 100.0) for i in range(6)])
    ok, line = touched(flat, [1000] * 6, keys_after)
    assert ok is True and "bound: the whole batch time" in line


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="bench extra")
def test_report_writes_markdown_json_and_png(tmp_path: Path) -> None:
    cfg = BenchConfig(keys=700, rows=200, batches=7)
    runs = (
        run("tws", 9000.0),
        EngineRun("vec", error="no module"),
        run("jvm", 200.0, state_ms=NAN),
    )
    rep = Report(cfg, runs, ((1.0, 2.0),) * 3, (100,) * 7, 12.0, "python -m loadtest.api_bench")
    md = write_report(tmp_path, rep)
    text = md.read_text()
    assert "N/A: vec within 2x" in text and "![batch time by engine]" in text
    doc = json.loads(md.with_suffix(".json").read_text())
    assert [s["engine"] for s in doc["stats"]] == ["tws", "vec", "jvm"]
    assert doc["stats"][2]["state_commit_ms"] is None  # NaN: JSON null
    assert md.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_report_json_reads_back_for_a_replot() -> None:
    cfg = BenchConfig(keys=700, rows=200, batches=7)
    runs = (run("vec", 150.0), run("jvm", 200.0))
    rep = Report(cfg, runs, ((1.0, 2.0), (2.0, 3.0)), (100,) * 7, 12.0, "cmd")
    back = Report.from_json(json.loads(json.dumps(rep.to_json())))
    assert back.cfg == cfg and back.loads == rep.loads and back.distinct == rep.distinct
    assert [s.batch_ms for s in back.stats] == [s.batch_ms for s in rep.stats]


def test_cpu_per_batch_leaves_the_start_up_out() -> None:
    from dataclasses import replace

    from loadtest.api_bench.stats import steady_cpu_s

    bs = [replace(batch(i, 100.0), cpu_s=30.0 + 2.0 * i) for i in range(1, 5)]
    assert steady_cpu_s(bs) == 2.0  # the 30 s of start-up before the first is not counted
    assert math.isnan(steady_cpu_s(bs[:1]))


def test_cpu_split_per_batch_jvm_and_its_jit_compilers(tmp_path: Path) -> None:
    from dataclasses import replace

    from loadtest.api_bench.cpu import jit_cpu_s
    from loadtest.api_bench.stats import steady_cpu_s

    bs = [
        replace(batch(i, 100.0), cpu_s=10.0 + 3 * i, jvm_cpu_s=5.0 + 2 * i, jit_cpu_s=1.0 + i)
        for i in range(1, 4)
    ]
    assert [steady_cpu_s(bs, f) for f in ("cpu_s", "jvm_cpu_s", "jit_cpu_s")] == [3, 2, 1]
    back = EngineRun.from_json(json.loads(json.dumps(EngineRun("vec", bs).to_json())))
    assert back.batches == bs
    old = {k: v for k, v in bs[0].to_json().items() if k not in ("jvm_cpu_s", "jit_cpu_s")}
    assert math.isnan(Batch.from_json(old).jit_cpu_s)  # a report from before the split
    # a /proc with one JIT compiler thread and one other thread (clock ticks: utime, stime)
    ticks = __import__("os").sysconf("SC_CLK_TCK")
    for tid, name, t in ((1, "C2 CompilerThre", 3 * ticks), (2, "Executor task l", 5 * ticks)):
        task = tmp_path / "42" / "task" / str(tid)
        task.mkdir(parents=True)
        rest = " ".join(["0"] * 10 + [str(t), str(t)] + ["0"] * 5)  # ppid..cmajflt, utime, stime
        (task / "stat").write_text(f"{tid} ({name}) S {rest}\n")
    assert jit_cpu_s(42, tmp_path) == 6.0
    assert math.isnan(jit_cpu_s(43, tmp_path))
    # a fresh process, no JVM below it (this test's worker may have started Spark)
    probe = (
        "from loadtest.api_bench.cpu import sample_tree as s; "
        "t = s(); print(t.total_s > 0, t.jvm_s, t.jit_s)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "nan", "nan"], out
    stats = EngineStats.of(EngineRun("vec", bs), [100] * 7, (1.0, 1.0))
    assert (stats.jvm_cpu_per_batch_s, stats.jit_cpu_per_batch_s) == (2.0, 1.0)
