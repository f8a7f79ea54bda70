"""Regenerate (or check) the generated tables in README.md.

The configuration table comes from ``ServerSettings`` and the metrics table
from ``ServerMetrics``, so the README cannot drift from the code.

Usage: python tools/gen_docs.py [--check]
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def config_table() -> str:
    from dstl_server.settings import ServerSettings

    rows = [
        "| flag | environment | default | unit | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, env, default, unit, doc in ServerSettings.describe():
        if ServerSettings.env_only(name):
            flag = "(environment only)"
        else:
            flag = "`--" + name.replace("_", "-") + "`"
        rows.append(f"| {flag} | `{env}` | `{default!r}` | {unit} | {doc} |")
    return "\n".join(rows)


def metrics_table() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from dstl_server.metrics import ServerMetrics

    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for metric in vars(ServerMetrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        kind = metric._type
        name = metric._name + ("_total" if kind == "counter" else "")
        labels = ", ".join(metric._labelnames) or "-"
        rows.append(f"| `{name}` | {kind} | {labels} | {metric._documentation} |")
    return "\n".join(rows)


def _fill(m: re.Match[str], body: str) -> str:
    return m.group(1) + body + "\n" + m.group(2)


def render(text: str) -> str:
    for marker, body in (("config", config_table()), ("metrics", metrics_table())):
        pattern = re.compile(
            rf"(<!-- BEGIN GENERATED {marker} -->\n)(?:.*?\n)?(<!-- END GENERATED {marker} -->)",
            re.S,
        )
        if not pattern.search(text):
            raise SystemExit(f"README.md lacks the GENERATED {marker} markers")
        text = pattern.sub(functools.partial(_fill, body=body), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    ns = parser.parse_args()
    current = README.read_text()
    fresh = render(current)
    if ns.check:
        if fresh != current:
            print("README.md tables are stale: run `python tools/gen_docs.py`", file=sys.stderr)
            return 1
        return 0
    README.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
