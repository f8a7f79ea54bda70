"""The import-linter contracts name every module of dstl_client outside the core.

`lint-imports` (in `make lint`) enforces the layers; this test keeps the lists
honest, so a new module cannot slip past the "core imports nothing else" and
"server imports only the core" contracts by not being named in them.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import dstl_client

ROOT = Path(__file__).resolve().parent.parent


def _forbidden_by_source() -> dict[tuple[str, ...], set[str]]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {
        tuple(c["source_modules"]): set(c["forbidden_modules"])
        for c in doc["tool"]["importlinter"]["contracts"]
        if c["type"] == "forbidden"
    }


def test_every_module_outside_the_core_is_named_in_the_layer_contracts() -> None:
    outside = {
        f"dstl_client.{m.name}"
        for m in pkgutil.iter_modules(dstl_client.__path__)
        if m.name != "core"
    }
    by_source = _forbidden_by_source()
    for source in (("dstl_client.core",), ("dstl_server",)):
        missing = sorted(outside - by_source[source])
        assert not missing, f"add {missing} to the forbidden modules of {source[0]}'s contract"


def test_the_client_never_imports_the_server() -> None:
    assert "dstl_server" in _forbidden_by_source()[("dstl_client",)]
