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
import dstl_server

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


def _server_layers() -> list[set[str]]:
    """The modules of each layer of the sidecar's contract, top first."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [
        c
        for c in doc["tool"]["importlinter"]["contracts"]
        if c["type"] == "layers" and c.get("containers") == ["dstl_server"]
    ]
    assert contract.get("exhaustive") is True
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def test_every_server_module_has_one_layer() -> None:
    named = [m for layer in _server_layers() for m in layer]
    assert len(named) == len(set(named)), "a module is named in two layers"
    modules = {m.name for m in pkgutil.iter_modules(dstl_server.__path__)}
    assert set(named) == modules, f"missing {sorted(modules - set(named))}"


def test_the_server_layers_read_as_the_one_line() -> None:
    # settings <- storage/uploader <- writer log <- registry <- calls <- service | session <- app
    order = ["app", "service", "calls", "registry", "log", "uploader", "storage", "settings"]
    depth = {m: i for i, layer in enumerate(_server_layers()) for m in layer}
    assert [depth[m] for m in order] == sorted(depth[m] for m in order)
    assert depth["service"] == depth["session"]  # siblings: neither imports the other


def test_the_server_has_an_acyclic_siblings_contract() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(
        c["type"] == "acyclic_siblings" and c["ancestors"] == ["dstl_server"]
        for c in doc["tool"]["importlinter"]["contracts"]
    )
