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
JOB_OPTIONS = ROOT / "docs" / "job-options.md"
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


def field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines above each field of ``cls`` and of its bases, joined."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        lines = inspect.getsource(klass).splitlines()
        for node in ast.parse(inspect.getsource(klass)).body[0].body:  # type: ignore[attr-defined]
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                comment: list[str] = []
                row = node.lineno - 2
                while row >= 0 and lines[row].strip().startswith("#:"):
                    comment.insert(0, lines[row].strip()[2:].strip())
                    row -= 1
                docs[node.target.id] = " ".join(comment)
    return docs


def _type_name(hint: object) -> str:
    text = getattr(hint, "__name__", None) if not getattr(hint, "__args__", None) else None
    text = text or str(hint).replace("typing.", "").replace("collections.abc.", "")
    return text.replace("NoneType", "None")


def _markdown(rst: str) -> str:
    """A docstring fragment as Markdown: ``x`` and :role:`x` as `x`, pipes escaped."""
    text = re.sub(r":\w+:`~?\.?([^`]+)`", r"`\1`", rst).replace("``", "`")
    return text.replace("|", "\\|")


def job_options_table() -> str:
    """One row per :class:`KeyedOptions` field: keyword, ``spark.dstl.*`` key, type, default."""
    import dataclasses
    import typing

    from dstl_client.batch.options import KeyedOptions
    from dstl_client.processor.conf import PREFIX, settable_from_conf

    docs = field_docs(KeyedOptions)
    hints = typing.get_type_hints(KeyedOptions)
    rows = [
        "| keyword | Spark configuration key | type | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in dataclasses.fields(KeyedOptions):
        head, *rest = f.name.split("_")
        key = PREFIX + head + "".join(w.capitalize() for w in rest)
        key_cell = f"`{key}`" if settable_from_conf(f.name) else "(keyword only)"
        default = "(required)" if f.default is dataclasses.MISSING else f"`{f.default!r}`"
        meaning = _markdown(docs.get(f.name, ""))
        kind = _type_name(hints[f.name]).replace("|", "\\|")
        rows.append(f"| `{f.name}` | {key_cell} | `{kind}` | {default} | {meaning} |")
    return "\n".join(rows)


def metrics_table(owner: object) -> str:
    """One row per metric attribute of ``owner`` (a ServerMetrics or CoordinatorMetrics)."""
    from prometheus_client.metrics import MetricWrapperBase

    suffix = {"counter": "_total", "info": "_info"}
    rows = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for metric in vars(owner).values():
        documented = getattr(metric, "documented", None)
        if documented is not None:  # a collector that reads its figure from its owner
            rows.append("| `{}` | {} | {} | {} |".format(*documented))
            continue
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
    JOB_OPTIONS: {"job-options": job_options_table},
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
