"""One engine in its own process: ``python -m loadtest.api_bench.engine ENGINE ...``.

The benchmark's command line starts one such process per engine, one after
the other, so that no engine shares a JVM, Python workers, a sidecar or page
cache warmth of its state with another. The process starts its own Spark
session (and, for a dstl engine, its own ``dstl-server``), runs the engine over
the input, writes its :class:`~loadtest.api_bench.figures.EngineRun` as JSON to
``--out`` and prints one progress line per batch as it goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from loadtest.api_bench.config import ENGINES, SIDECAR_ENGINES, BenchConfig
from loadtest.api_bench.cpu import sample_tree
from loadtest.api_bench.figures import EngineRun


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


@contextlib.contextmanager
def sidecar(engine: str, root: Path) -> Iterator[str]:
    """The address of a fresh ``dstl-server`` for a dstl engine ("" for Spark's)."""
    if engine not in SIDECAR_ENGINES:
        yield ""
        return
    from dstl_server.testing import ServerProcess

    with ServerProcess(root) as server:
        yield server.address


def run(engine: str, cfg: BenchConfig, input_dir: Path, work: Path) -> EngineRun:
    from loadtest.api_bench.job import run_engine, session

    t0 = time.perf_counter()
    spark = session(cfg, engine)
    log(f"{engine}: Spark session up in {time.perf_counter() - t0:.1f}s")
    try:
        with sidecar(engine, work / "sidecar") as address:
            result = run_engine(engine, spark, cfg, input_dir, work, address, log, sample_tree)
            result.cpu_s = sample_tree().total_s
            return result
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.api_bench.engine")
    parser.add_argument("engine", choices=ENGINES)
    parser.add_argument("--config", required=True, help="BenchConfig as JSON")
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the EngineRun as JSON")
    ns = parser.parse_args(argv)

    def _stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: the sidecar and Spark stop

    signal.signal(signal.SIGTERM, _stop)
    ns.work.mkdir(parents=True, exist_ok=True)
    result = run(ns.engine, BenchConfig.from_json(ns.config), ns.input, ns.work)
    ns.out.write_text(json.dumps(result.to_json()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
