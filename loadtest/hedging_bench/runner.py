"""A whole hedging benchmark run: SeaweedFS, the fault proxy, every mode, the JSON report."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dstl_server.testing_s3 import SeaweedS3
from loadtest.hedging_bench.config import BenchConfig
from loadtest.hedging_bench.modes import ModeResult, run_mode
from loadtest.hedging_bench.report import table, verdicts
from loadtest.s3fault import FaultProxyProcess


def run(cfg: BenchConfig, report_dir: Path) -> dict[str, Any]:
    results: list[ModeResult] = []
    root = Path(tempfile.mkdtemp(prefix="dstl-hedging-bench-"))
    with (
        SeaweedS3() as s3,
        FaultProxyProcess(s3.endpoint_url, faults=cfg.faults(), seed=cfg.seed) as proxy,
    ):
        for mode in cfg.modes:
            print(f"[hedging_bench] mode {mode} ...", file=sys.stderr, flush=True)
            results.append(run_mode(cfg, mode, s3, proxy, root))
    report = {
        "bench": "hedging",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
        },
        "config": asdict(cfg),
        "results": [asdict(r) for r in results],
        "verdicts": verdicts(results),
        "table": table(results, cfg),
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    name = f"hedging-{'quick-' if cfg.quick else ''}{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    path = report_dir / name
    path.write_text(json.dumps(report, indent=2) + "\n")
    report["path"] = str(path)
    return report
