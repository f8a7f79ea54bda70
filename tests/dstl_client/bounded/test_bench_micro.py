"""The bounded benchmark's micro part, small: every backend measured, Flink's published figures
printed beside ours, a report written (no Spark)."""

from __future__ import annotations

from pathlib import Path

from loadtest.bounded_bench.config import BenchConfig
from loadtest.bounded_bench.micro import BACKENDS, run_micro
from loadtest.bounded_bench.report import goals, micro_table, write_report


def test_micro_benchmark_runs_small_and_reports(tmp_path: Path) -> None:
    results = run_micro(tmp_path, ops=500, setup_keys=300, rounds=1, log=lambda _: None)
    assert [r.backend for r in results] == list(BACKENDS)
    assert all(v > 0 for r in results for v in r.ops_per_ms.values())
    table = micro_table(results)
    assert "| Flink, Java, published: SINGLE_KEY | 18,282 | 30,861 | 32,883 |" in table
    assert "dstl, Python, this machine: single-key" in table
    assert "single-key / keyed (dstl)" in table
    cfg = BenchConfig(job=False, micro_ops=500, micro_setup_keys=300, micro_rounds=1)
    path = write_report(tmp_path / "reports", cfg, results, None, 1.0)
    assert path.name.startswith("bounded-") and path.suffix == ".md"
    assert "Flink, Java, published" in path.read_text()
    assert goals(None) == []
