"""dstl_client.connect: one precedence for the sidecar's address and token, used by every caller.

Given to the process (argument, job option, flag) > this node's environment >
passed along from another node (a task's plan) > none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dstl_client.checkpoint.messages import BatchPlan
from dstl_client.connect import (
    ADDRESS_ENV,
    CA_FILE_ENV,
    TOKEN_ENV,
    ca_file,
    find_address,
    find_token,
    require_address,
    root_certificates,
)
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.core.errors import ConfigError
from dstl_client.state.clients import resolve_address


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (ADDRESS_ENV, TOKEN_ENV, CA_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_address_given_beats_the_environment_beats_the_one_passed_along(
    no_env: pytest.MonkeyPatch,
) -> None:
    assert find_address() == ""
    assert find_address(passed="driver:1") == "driver:1"
    no_env.setenv(ADDRESS_ENV, "node:2")
    assert find_address(passed="driver:1") == "node:2"
    assert find_address("given:3", passed="driver:1") == "given:3"
    # an empty value counts as none, wherever it comes from
    no_env.setenv(ADDRESS_ENV, "")
    assert find_address("", passed="driver:1") == "driver:1"


def test_the_token_given_beats_the_environment_beats_the_one_passed_along(
    no_env: pytest.MonkeyPatch,
) -> None:
    assert find_token() is None
    assert find_token(passed="driver-token") == "driver-token"
    no_env.setenv(TOKEN_ENV, "node-token")
    assert find_token(passed="driver-token") == "node-token"
    assert find_token("given-token", passed="driver-token") == "given-token"
    # a token given empty says: no token (the environment's is not taken)
    assert find_token("") == ""
    no_env.setenv(TOKEN_ENV, "")
    assert find_token() is None


def test_no_address_is_a_config_error_saying_how_to_give_one() -> None:
    assert require_address("a:1", "pass it") == "a:1"
    with pytest.raises(ConfigError, match=r"^no sidecar address: pass it$"):
        require_address("", "pass it")


def test_the_ca_bundle_comes_from_the_environment(
    no_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert ca_file() is None and root_certificates(None) is None
    pem = tmp_path / "ca.pem"
    pem.write_bytes(b"PEM")
    no_env.setenv(CA_FILE_ENV, str(pem))
    assert ca_file() == str(pem) and root_certificates(ca_file()) == b"PEM"
    with pytest.raises(ConfigError, match=f"{CA_FILE_ENV}=.*cannot read"):
        root_certificates(str(tmp_path / "missing.pem"))


def test_the_driver_and_a_task_follow_the_same_rule(no_env: pytest.MonkeyPatch) -> None:
    """The driver's argument is "given"; in a task the plan is "passed along"."""
    no_env.setenv(ADDRESS_ENV, "node:2")
    no_env.setenv(TOKEN_ENV, "node-token")
    driver = CoordinatorConfig(job_id="j", checkpoint_dir="/c", dstl_address="given:3")
    assert driver.resolved().dstl_address == "given:3"
    assert driver.resolved().dstl_token == "node-token"
    assert CoordinatorConfig(job_id="j", checkpoint_dir="/c").resolved().dstl_address == "node:2"
    plan = BatchPlan("j", "keyed", 0, 1, 16, "/s", None, "driver:1", "driver-token")
    assert resolve_address(plan) == ("node:2", "node-token")
