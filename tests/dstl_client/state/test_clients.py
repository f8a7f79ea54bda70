"""dstl_client.state.clients: a task finds its own node's sidecar and state directory.

On a cluster the driver's defaults name the driver's node; each executor's
environment (``DSTL_ADDRESS``, ``DSTL_TOKEN``, ``DSTL_STATE_DIR``) wins.
"""

from __future__ import annotations

import pytest

from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.connect import ADDRESS_ENV, TOKEN_ENV
from dstl_client.core.errors import ConfigError
from dstl_client.state.clients import STATE_DIR_ENV, resolve_address, resolve_state_dir


def plan(address: str | None = "driver:7070", token: str | None = "driver-token") -> BatchPlan:
    return BatchPlan("job", "keyed", 0, 2, 16, "/driver/state", None, address, token)


def test_the_plan_applies_without_node_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ADDRESS_ENV, TOKEN_ENV, STATE_DIR_ENV):
        monkeypatch.delenv(name, raising=False)
    assert resolve_address(plan()) == ("driver:7070", "driver-token")
    assert resolve_state_dir(plan()) == "/driver/state"


def test_the_nodes_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDRESS_ENV, "unix:///run/dstl/dstl.sock")
    monkeypatch.setenv(TOKEN_ENV, "node-token")
    monkeypatch.setenv(STATE_DIR_ENV, "/mnt/local-ssd/dstl")
    assert resolve_address(plan()) == ("unix:///run/dstl/dstl.sock", "node-token")
    assert resolve_state_dir(plan()) == "/mnt/local-ssd/dstl"


def test_no_address_anywhere_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    with pytest.raises(ConfigError, match=ADDRESS_ENV):
        resolve_address(plan(address=None))
