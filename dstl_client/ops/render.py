"""Output of the ``dstl`` CLI: readable tables, or JSON for scripts; progress on stderr."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def size(n: int | None) -> str:
    """``1536`` -> ``1.5 KiB``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def when(unix: float | None) -> str:
    """Seconds since the epoch as UTC, ``2026-01-31 12:00:00Z``; ``-`` for none."""
    if not unix:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(unix))


def age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(c) for c in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        bool(rows)
        and all(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in rows)
        for i in range(len(headers))
    ]
    for r in cells:
        line = "  ".join(
            c.rjust(widths[i]) if numeric[i] else c.ljust(widths[i]) for i, c in enumerate(r)
        )
        out.write(line.rstrip() + "\n")


def fields(pairs: Sequence[tuple[str, Any]], out: TextIO) -> None:
    """``name: value`` lines, names aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    for k, v in pairs:
        out.write(f"{(k + ':').ljust(width + 1)} {'-' if v is None else v}\n")


def emit_json(doc: Any, out: TextIO) -> None:
    out.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")


class Progress:
    """A counter on stderr, rewritten in place, only when stderr is a terminal."""

    def __init__(self, what: str, stream: TextIO | None = None) -> None:
        self.what = what
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.n = 0
        self._shown = 0.0

    def step(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.enabled and now - self._shown >= 0.2:
            self._shown = now
            self.stream.write(f"\r{self.what}: {self.n}")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled and self._shown:
            self.stream.write(f"\r{self.what}: {self.n}\n")
            self.stream.flush()
