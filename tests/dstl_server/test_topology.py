"""dstl_server.topology: each node's parent in a static tree, and bad topologies refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dstl_client.core.errors import ConfigError
from dstl_server.settings import ServerSettings
from dstl_server.topology import TreeSpec, children_of, depth_of, parent_index, resolve_parent

TEMPLATE = "dstl-{index}.dstl-tree:7070"


def tree(index: int, size: int = 10, fanout: int = 3) -> TreeSpec:
    return TreeSpec(index, size, fanout, TEMPLATE)


def test_parents_children_and_depth() -> None:
    assert parent_index(0, 3) is None
    assert [parent_index(i, 3) for i in range(1, 8)] == [0, 0, 0, 1, 1, 1, 2]
    assert [parent_index(i, 1) for i in range(1, 4)] == [0, 1, 2]  # a chain
    assert children_of(0, 10, 3) == [1, 2, 3]
    assert children_of(3, 10, 3) == []
    assert children_of(2, 10, 3) == [7, 8, 9]
    assert depth_of(0, 3) == 0
    assert depth_of(9, 3) == 2
    assert depth_of(3, 1) == 3


def test_every_node_but_the_root_has_exactly_one_parent_among_the_nodes() -> None:
    for size in range(1, 30):
        for fanout in range(1, 6):
            seen = [c for i in range(size) for c in children_of(i, size, fanout)]
            assert sorted(seen) == list(range(1, size))
            for i in range(1, size):
                assert 0 <= parent_index(i, fanout) < i  # type: ignore[operator]


def test_resolve_parent_from_the_tree_or_explicitly() -> None:
    assert resolve_parent("", tree(0), "0.0.0.0:7070") == ""
    assert resolve_parent("", tree(5), "0.0.0.0:7070") == "dstl-1.dstl-tree:7070"
    assert resolve_parent("", None, "127.0.0.1:7070") == ""
    assert resolve_parent("10.0.0.1:7070", None, "127.0.0.1:7070") == "10.0.0.1:7070"


@pytest.mark.parametrize(
    ("parent", "spec", "match"),
    [
        ("", tree(10), "out of range"),
        ("", tree(-2), "out of range"),
        ("", tree(1, size=0), "tree_size"),
        ("", tree(1, fanout=0), "tree_fanout"),
        ("", TreeSpec(1, 3, 2, "fixed:7070"), "index"),
        ("p:7070", tree(1), "not both"),
        ("127.0.0.1:7070", None, "own parent"),
        ("nohost", None, "host:port"),
    ],
)
def test_bad_topology_is_a_config_error(parent: str, spec: TreeSpec | None, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve_parent(parent, spec, "127.0.0.1:7070")


def test_settings_validate_the_forwarding_knobs() -> None:
    s = ServerSettings(
        tree_index=2, tree_size=3, tree_fanout=1, tree_address_template="127.0.0.{index}:7071"
    )
    assert s.parent_address == "127.0.0.1:7071"
    assert ServerSettings().parent_address == ""
    with pytest.raises(ConfigError, match="non-loopback parent"):
        ServerSettings(parent="10.1.2.3:7070")
    with pytest.raises(ConfigError, match="forward_timeout_s"):
        ServerSettings(parent="127.0.0.1:7171", forward_timeout_s=60.0)
    with pytest.raises(ConfigError, match="forward_threshold_bytes"):
        ServerSettings(parent="127.0.0.1:7171", forward_threshold_bytes=0)
    with pytest.raises(ConfigError, match="tree_index"):
        ServerSettings(tree_index=-3)
    env = {
        "DSTL_PARENT": "10.1.2.3:7070",
        "DSTL_PARENT_TOKEN_FILE": "/t",
        "DSTL_PARENT_CA_FILE": "/ca",
    }
    assert ServerSettings.from_sources(environ=env).parent_address == "10.1.2.3:7070"


def test_the_cli_refuses_a_bad_topology_with_exit_2_and_one_line() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dstl_server",
            "--tree-index",
            "1",
            "--tree-size",
            "3",
            "--parent",
            "127.0.0.1:7171",
            "--tree-address-template",
            "h{index}:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "not both" in res.stderr


def test_forwarding_knobs_are_ignored_without_a_parent() -> None:
    # opt-in: with no parent, nothing about forwarding is checked or used
    s = ServerSettings(upload_deadline_s=1.0, forward_threshold_bytes=0)
    assert s.parent_address == ""
