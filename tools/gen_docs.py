"""Regenerate (or check) the generated tables in docs/sidecar.md and docs/observability.md.

The configuration table comes from ``ServerSettings``, the metrics tables
from ``ServerMetrics`` (sidecar) and ``CoordinatorMetrics`` (driver), so the
docs cannot drift from the code.

Usage: python tools/gen_docs.py [--check]
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDECAR = ROOT / "docs" / "sidecar.md"
OBSERVABILITY = ROOT / "docs" / "observability.md"


def config_table() -> str:
    from dstl_server.settings import ServerSettings, format_size, is_size

    rows = [
        "| flag | environment | default | unit | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, env, default, unit, doc in ServerSettings.describe():
        if ServerSettings.env_only(name):
            flag = "(environment only)"
        else:
            flag = "`--" + name.replace("_", "-") + "`"
        if is_size(name):  # sizes take units: the default as one would write it
            default, unit = format_size(default), "bytes (size)"
            rows.append(f"| {flag} | `{env}` | `{default}` | {unit} | {doc} |")
        else:
            rows.append(f"| {flag} | `{env}` | `{default!r}` | {unit} | {doc} |")
    return "\n".join(rows)


def metrics_table(owner: object) -> str:
    """One row per metric attribute of ``owner`` (a ServerMetrics or CoordinatorMetrics)."""
    from prometheus_client.metrics import MetricWrapperBase

    suffix = {"counter": "_total", "info": "_info"}
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for metric in vars(owner).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        kind = str(metric._type)
        name = metric._name + suffix.get(kind, "")
        labels = ", ".join(metric._labelnames) or "-"
        rows.append(f"| `{name}` | {kind} | {labels} | {metric._documentation} |")
    return "\n".join(rows)


def sidecar_metrics_table() -> str:
    from dstl_server.metrics import ServerMetrics

    return metrics_table(ServerMetrics())


def driver_metrics_table() -> str:
    from dstl_client.coordinator.metrics import CoordinatorMetrics

    return metrics_table(CoordinatorMetrics("job"))


def _fill(m: re.Match[str], body: str) -> str:
    return m.group(1) + body + "\n" + m.group(2)


#: the generated sections of each file, by marker
SECTIONS: dict[Path, dict[str, Callable[[], str]]] = {
    SIDECAR: {"config": config_table},
    OBSERVABILITY: {"metrics": sidecar_metrics_table, "driver-metrics": driver_metrics_table},
}


def render(text: str, path: Path = SIDECAR) -> str:
    for marker, table in SECTIONS[path].items():
        pattern = re.compile(
            rf"(<!-- BEGIN GENERATED {marker} -->\n)(?:.*?\n)?(<!-- END GENERATED {marker} -->)",
            re.S,
        )
        if not pattern.search(text):
            raise SystemExit(f"{path.name} lacks the GENERATED {marker} markers")
        text = pattern.sub(functools.partial(_fill, body=table()), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    ns = parser.parse_args()
    stale = []
    for path in SECTIONS:
        current = path.read_text()
        fresh = render(current, path)
        if fresh != current:
            stale.append(path.relative_to(ROOT).as_posix())
            if not ns.check:
                path.write_text(fresh)
    if ns.check and stale:
        print(
            f"tables in {', '.join(stale)} are stale: run `python tools/gen_docs.py`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
