"""Each upper-floor module of the client imports first, in a fresh interpreter.

The dispatch of a bounded input into :mod:`dstl_client.bounded` (from
``transform_with_state`` and ``process_keyed``) is the one upward edge of the
client's layers; whichever module a program imports first, no import may
find another half initialized.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FIRST = (
    "dstl_client.batch.cycle",
    "dstl_client.bounded",
    "dstl_client.bounded.dataframe",
    "dstl_client.bounded.runner",
    "dstl_client.processor",
    "dstl_client.processor.frames",
    "dstl_client.processor.transform",
    "dstl_client.spark",
    "dstl_client.spark.keyed",
)


@pytest.mark.parametrize("module", FIRST)
def test_the_module_imports_first(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
