"""Helpers shared by the benchmark smoke tests."""

from __future__ import annotations

import psutil


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``text`` (leak checks after a run)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in p.info["cmdline"] or ()):
                out.append(p)
        except psutil.Error:
            continue
    return out
