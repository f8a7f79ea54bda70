"""The benchmarks' plots (loadtest/plots.py) on small synthetic figures: each draw writes
a valid, small PNG; empty or mismatched input is refused with a PlotInputError naming
what is missing; each report step's glue turns its bench's records into the plot's.
Fast: no Spark session, no server, no network."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from pathlib import Path
from types import ModuleType

import pytest

from loadtest.plots import (
    DPI,
    FIGSIZE,
    EngineBatches,
    PlotInputError,
    RestoreCurve,
    Series,
    attempt,
    curves_from_json,
    curves_to_json,
    draw_batch_time_by_engine,
    draw_checkpoint_vs_state,
    draw_restore_vs_tail,
    draw_tail_ratio_sweep,
    main,
)

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: what the committed PNGs under docs/img must stay below
MAX_PNG_BYTES = 150_000

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is in the bench extra (`pip install -e '.[dev,bench]'`)",
)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails the test if ``path`` is no PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND", f"{path} is truncated"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def assert_small_png(path: Path, width: float = FIGSIZE[0]) -> None:
    w, h = png_size(path)
    assert (w, h) == (round(width * DPI), round(FIGSIZE[1] * DPI))
    assert path.stat().st_size < MAX_PNG_BYTES


def checkpoint_series() -> list[Series]:
    mb = tuple(10.0 + 2 * i for i in range(12))
    return [
        Series("dstl changelog", mb, tuple(25.0 + (i % 3) for i in range(12))),
        Series("dstl full snapshot every batch", mb, tuple(400.0 + 60 * i for i in range(12))),
        # whole milliseconds from Spark: a 0 is drawn at the floor, not dropped
        Series("Spark RocksDB", tuple(2 * x for x in mb), (0.0, *(60.0 + i for i in range(11)))),
    ]


def restore_curves() -> list[RestoreCurve]:
    return [
        RestoreCurve("p=2, read cache", (0, 10, 100), (0.7, 0.8, 1.6), 0.77),
        RestoreCurve("p=2, no read cache", (0, 10, 100), (1.3, 1.4, 2.6), 1.32),
        RestoreCurve("p=4, no read cache", (0, 10, 100), (1.1, 1.2, 2.2), None),
    ]


def engines() -> list[EngineBatches]:
    ids = tuple(range(10))
    return [
        EngineBatches(
            "Spark\ntransformWithStateInPandas", ids, tuple(14000.0 + 90 * i for i in ids), 1
        ),
        EngineBatches(
            "Spark\napplyInPandasWithState", ids, tuple(11000.0 + 50 * i for i in ids), 1
        ),
        EngineBatches("dstl\ntransform_with_state", ids, (9000.0, *(4300.0,) * 9), 1),
    ]


@pytest.mark.slow
@needs_matplotlib
def test_checkpoint_vs_state_writes_a_small_png(tmp_path: Path) -> None:
    out = draw_checkpoint_vs_state(checkpoint_series(), tmp_path / "sub" / "c.png", "a title")
    assert out == tmp_path / "sub" / "c.png"
    assert_small_png(out, width=FIGSIZE[0] * 1.5)


@needs_matplotlib
def test_restore_vs_tail_writes_a_small_png(tmp_path: Path) -> None:
    assert_small_png(draw_restore_vs_tail(restore_curves(), tmp_path / "r.png", "title"))


@needs_matplotlib
def test_tail_ratio_sweep_writes_a_small_png(tmp_path: Path) -> None:
    ratios = (0.0, 0.05, 0.1, 0.2, 0.5)
    restore = [Series("longest tail", ratios, (2.0, 1.03, 1.08, 1.2, 1.5))]
    upload = [Series("per checkpoint", ratios, (0.7, 7.5, 4.1, 2.4, 1.4))]
    png = draw_tail_ratio_sweep(restore, upload, tmp_path / "s.png", "t", goal=1.2, chosen=0.1)
    assert_small_png(png, FIGSIZE[0] * 1.5)


@pytest.mark.slow
@needs_matplotlib
def test_batch_time_by_engine_writes_a_small_png(tmp_path: Path) -> None:
    out = draw_batch_time_by_engine(engines(), tmp_path / "a.png", "title")
    assert_small_png(out, width=FIGSIZE[0] * 1.5)


def test_empty_input_is_refused_by_name(tmp_path: Path) -> None:
    png = tmp_path / "x.png"
    with pytest.raises(PlotInputError, match="no series"):
        draw_checkpoint_vs_state([], png)
    with pytest.raises(PlotInputError, match="no restore curves"):
        draw_restore_vs_tail([], png)
    with pytest.raises(PlotInputError, match="no engines"):
        draw_batch_time_by_engine([], png)
    with pytest.raises(PlotInputError, match="'rocksdb' has no points"):
        draw_checkpoint_vs_state([*checkpoint_series(), Series("rocksdb", (), ())], png)
    with pytest.raises(PlotInputError, match="'p=2' has no points"):
        draw_restore_vs_tail([RestoreCurve("p=2", (), (), 1.0)], png)
    with pytest.raises(PlotInputError, match="'dstl' has no points"):
        draw_batch_time_by_engine([EngineBatches("dstl", (), ())], png)
    with pytest.raises(PlotInputError, match="finite"):
        draw_checkpoint_vs_state([Series("nan", (1.0,), (float("nan"),))], png)
    assert not png.exists()


def test_x_and_y_that_do_not_pair_up_are_refused() -> None:
    with pytest.raises(PlotInputError, match="2 x values but 1 y values"):
        Series("s", (1.0, 2.0), (3.0,))
    with pytest.raises(PlotInputError, match="3 tails but 2 times"):
        RestoreCurve("c", (0, 10, 100), (1.0, 2.0))
    with pytest.raises(PlotInputError, match="1 batch ids but 0 times"):
        EngineBatches("e", (0,), ())


def test_attempt_reports_why_not_instead_of_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    why = attempt(lambda: draw_restore_vs_tail([], tmp_path / "r.png"))
    assert why is not None and "no restore curves" in why
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    why = attempt(lambda: draw_restore_vs_tail(restore_curves(), tmp_path / "r.png"))
    assert why is not None and "matplotlib is not installed" in why
    assert not (tmp_path / "r.png").exists()


def test_warmup_batches_stay_out_of_the_median_only() -> None:
    e = EngineBatches("e", (0, 1, 2), (900.0, 10.0, 20.0), warmup=1)
    assert e.measured_ms == [10.0, 20.0]
    assert EngineBatches("e", (0,), (5.0,), warmup=3).measured_ms == [5.0]


@needs_matplotlib
def test_saved_curves_of_two_runs_combine_into_one_png(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(curves_to_json(restore_curves()[:1]))
    b.write_text(curves_to_json(restore_curves()[1:]))
    assert curves_from_json(a.read_text()) + curves_from_json(b.read_text()) == restore_curves()
    out = tmp_path / "both.png"
    assert main(["restore-vs-tail", str(out), str(a), str(b), "--title", "t"]) == 0
    assert_small_png(out)
    assert main(["restore-vs-tail", str(out), str(a), str(b), "--match", "p=2,"]) == 0
    with pytest.raises(PlotInputError, match="no restore curves"):
        main(["restore-vs-tail", str(out), str(a), "--match", "p=8,"])
    with pytest.raises(PlotInputError, match="not a list of restore curves"):
        curves_from_json(json.dumps({"label": "x"}))


def _spark_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_bench", REPO / "examples/spark_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spark_results() -> dict[str, object]:
    def batches(ms: float, step: float) -> list[dict[str, float]]:
        return [
            {"batch": i, "checkpoint_ms": ms + step * i, "state_bytes": 1e7 + 2e6 * i}
            for i in range(6)
        ]

    return {
        "args": {"rows_per_batch": 100, "keys": 1000, "parallelism": 2, "batches": 6},
        "modes": {
            "changelog": {"batches": batches(25, 0)},
            "full": {"batches": batches(400, 60)},
            "rocksdb": {"batches": batches(60, 1)},
        },
        "load_avg": [1.5, 2.5],
    }


@needs_matplotlib
def test_spark_bench_replots_a_finished_runs_results(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps(_spark_results()))
    assert _spark_bench().main(["--replot", str(results)]) == 0
    assert_small_png(tmp_path / "checkpoint-vs-state.png", width=FIGSIZE[0] * 1.5)


def test_spark_bench_refuses_results_without_batches(tmp_path: Path) -> None:
    with pytest.raises(PlotInputError, match="no series"):
        _spark_bench().plot_results(
            {"args": {}, "modes": {"full": {"batches": []}}}, tmp_path / "x.png"
        )


def test_recovery_report_turns_restores_into_curves() -> None:
    from loadtest.recovery_bench.config import BenchConfig
    from loadtest.recovery_bench.report import restore_curves as curves_of
    from loadtest.recovery_bench.restorer import JobRestore, SubtaskRestore
    from loadtest.recovery_bench.runner import DstlResult, RecordRestores

    def job(p: int, seconds: float) -> JobRestore:
        return JobRestore(p, (SubtaskRestore(0, 10.0, 10.0 + seconds, 1, 0, 1, 0.1),))

    def record(kind: str, tail: int, s: float) -> RecordRestores:
        return RecordRestores(kind, tail, 1, 1, {2: job(2, s)}, {2: job(2, s), 4: job(4, s / 2)})

    dstl = DstlResult(
        restores=[record("tail", 0, 1.0), record("tail", 10, 1.2), record("full", 10, 1.1)]
    )
    cfg = BenchConfig(tails=(0, 10), restore_parallelisms=(2, 4), read_cache_bytes=0)
    curves = curves_of(cfg, dstl)
    assert [c.label for c in curves] == [
        "p=2, no read cache (another node)",
        "p=4, no read cache (another node)",
    ]
    assert curves[0].tails == (0, 10)
    assert curves[0].seconds == pytest.approx((1.0, 1.2))
    assert curves[0].full_snapshot_s == pytest.approx(1.1)
    assert curves[1].seconds == pytest.approx((0.5, 0.6))
    assert curves_of(cfg, DstlResult()) == []


def test_recovery_report_turns_the_sweep_into_a_goal_and_a_table() -> None:
    from loadtest.recovery_bench.config import DEFAULT_TAIL_RATIO, BenchConfig
    from loadtest.recovery_bench.dstl_job import JobFigures
    from loadtest.recovery_bench.report import default_goal, sweep_series, sweep_table
    from loadtest.recovery_bench.restorer import JobRestore, SubtaskRestore
    from loadtest.recovery_bench.runner import DstlResult, RatioPoint, RatioRestore, RecordRestores

    def job(s: float) -> JobRestore:
        return JobRestore(2, (SubtaskRestore(0, 10.0, 10.0 + s, 1, 0, 1, 0.1),))

    def figures(log_mb: float, mat_mb: float, mats: int) -> JobFigures:
        return JobFigures(1.0, 1.0, 12, (), 0, int(log_mb * 1e6), int(mat_mb * 1e6), mats)

    cfg = BenchConfig(tails=(0, 10), restore_parallelisms=(2,), tail_ratios=(0.5,))
    assert cfg.sweep == tuple(sorted({0.5, DEFAULT_TAIL_RATIO} - {0.0}))
    restores = [
        RecordRestores(kind, t, t, t, {2: job(s)}, {2: job(s)}, t / 10)
        for kind, t, s in (("tail", 0, 1.0), ("tail", 10, 2.0), ("full", 10, 1.0))
    ]
    points = [
        RatioPoint(
            r,
            {10: RatioRestore(10, 2, 0.02, 1.1)},
            RatioRestore(4, 4, r + 0.01, 1.15),
            1.0,
            figures(10.0, 40.0 / r / 10, 2),
        )
        for r in cfg.sweep
    ]
    dstl = DstlResult(job=figures(10.0, 0.0, 0), restores=restores, sweep=points)
    table = sweep_table(cfg, dstl)
    off_row = next(line for line in table.splitlines() if line.startswith("| off"))
    assert off_row.endswith("| 2.00x | 2.00x (10, 1.00) | 1.00 | 0 | 1.00 | 1.0x |"), table
    restore, upload = sweep_series(cfg, dstl)
    assert restore[0].xs == (0.0, *cfg.sweep) and restore[0].ys[0] == pytest.approx(2.0)
    assert upload[0].ys[0] == pytest.approx(1.0)  # 10 MB over 10 checkpoints
    goal = default_goal(cfg, dstl)
    assert goal is not None
    ok, line = goal
    if DEFAULT_TAIL_RATIO > 0:
        assert ok and "after a changelog tail of 10 checkpoints: 1.10x" in line
        assert "MB per checkpoint" in line
    else:
        assert not ok and "2.00x" in line


def test_api_report_keeps_only_engines_that_ran() -> None:
    pytest.importorskip("pyspark")
    from loadtest.api_bench.figures import Batch, EngineRun
    from loadtest.api_bench.report import engine_batches

    def batch(i: int, ms: float) -> Batch:
        return Batch(i, 10, 5, ms, ms, 1.0, 2.0, None)

    runs = [
        EngineRun("tws", [batch(0, 900.0), batch(1, 300.0)]),
        EngineRun("apply", [], error="timed out"),
        EngineRun("dstl", [batch(0, 500.0), batch(1, 100.0)]),
    ]
    got = engine_batches(runs, warmup=1)
    assert [e.label.split("\n")[1] for e in got] == [
        "transformWithStateInPandas",
        "transform_with_state",
    ]
    assert got[1].batch_ms == (500.0, 100.0) and got[1].measured_ms == [100.0]


@needs_matplotlib
def test_tree_report_plot_draws_with_the_shared_helpers(tmp_path: Path) -> None:
    from loadtest.tree_bench.report import plot
    from loadtest.tree_bench.runner import ConfigResult

    def result(name: str, objects: float, lat: list[float]) -> ConfigResult:
        return ConfigResult(
            name, 4, 2, "10,20", 5, 20, objects, 2, objects, 9, 5.0, 9.0, 9.5, 10.0, 1.0, 1.0,
            0, 1e6, 20, [], [], latencies_ms=lat,
        )  # fmt: skip

    out = tmp_path / "tree.png"
    results = {"direct": result("direct", 9.5, [3.0, 5.0, 40.0]), "tree": result("tree", 1.4, [])}
    assert plot(results, out, "title") is None
    w, _ = png_size(out)
    assert w == 12 * DPI and out.stat().st_size < MAX_PNG_BYTES
