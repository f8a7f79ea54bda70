"""The static forwarding tree: which node a node forwards its small flushes to.

A node has a parent either explicitly (``parent = host:port``) or from its
place in a static tree of ``size`` nodes with fan-out ``fanout``: node 0 is
the root (no parent), the parent of node ``i`` is ``(i - 1) // fanout``, and
its address is ``address_template`` with ``{index}`` replaced (e.g.
``dstl-{index}.dstl-tree:7070``, a StatefulSet behind a headless service).
A node of index -1 is in no tree. Bad topology is a :class:`ConfigError` at
start (exit 2, one line). Pure functions; any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dstl_client.core.errors import ConfigError

#: the 64 KiB a forward request keeps below max_request_bytes (job id, framing)
_REQUEST_ROOM = 64 * 1024


@dataclass(frozen=True, slots=True)
class TreeSpec:
    """A node's place in a static tree: ``index`` in ``[0, size)``, ``fanout >= 1``."""

    index: int
    size: int
    fanout: int
    address_template: str

    def check(self) -> None:
        if self.size < 1:
            raise ConfigError(f"setting tree_size={self.size}: must be >= 1 with tree_index")
        if not 0 <= self.index < self.size:
            raise ConfigError(
                f"setting tree_index={self.index}: out of range for tree_size={self.size}"
            )
        if self.fanout < 1:
            raise ConfigError(f"setting tree_fanout={self.fanout}: must be >= 1")
        if "{index}" not in self.address_template:
            raise ConfigError(
                f"setting tree_address_template={self.address_template!r}: must contain "
                "'{index}' (e.g. dstl-{index}.dstl-tree:7070)"
            )

    def address_of(self, index: int) -> str:
        return self.address_template.replace("{index}", str(index))


def parent_index(index: int, fanout: int) -> int | None:
    """The parent of node ``index`` (None for the root, 0)."""
    if fanout < 1:
        raise ConfigError(f"setting tree_fanout={fanout}: must be >= 1")
    if index < 0:
        raise ConfigError(f"setting tree_index={index}: must be >= 0")
    return None if index == 0 else (index - 1) // fanout


def children_of(index: int, size: int, fanout: int) -> list[int]:
    """The direct children of node ``index`` in a tree of ``size`` nodes."""
    first = index * fanout + 1
    return list(range(first, min(size, first + fanout)))


def depth_of(index: int, fanout: int) -> int:
    """Edges from node ``index`` to the root."""
    depth = 0
    parent = parent_index(index, fanout)
    while parent is not None:
        depth += 1
        parent = parent_index(parent, fanout)
    return depth


def resolve_parent(parent: str, tree: TreeSpec | None, listen: str) -> str:
    """The address this node forwards to, "" for none (the root, or no tree).

    ``parent`` (explicit) and ``tree`` exclude each other; a parent equal to
    this node's own ``listen`` address (or its own tree address) is refused.
    """
    if parent and tree is not None:
        raise ConfigError("give the parent once: parent or tree_index/tree_size, not both")
    if tree is not None:
        tree.check()
        up = parent_index(tree.index, tree.fanout)
        if up is None:
            return ""
        if up == tree.index:  # pragma: no cover - (i - 1) // f < i for every i >= 1
            raise ConfigError(f"setting tree_index={tree.index}: the node would be its own parent")
        address = tree.address_of(up)
        if address == tree.address_of(tree.index):
            raise ConfigError(
                f"setting tree_address_template={tree.address_template!r}: every node gets "
                "the same address"
            )
        parent = address
    if not parent:
        return ""
    host, _, port = parent.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"setting parent={parent!r}: expected host:port")
    if listen and parent == listen:
        raise ConfigError(f"setting parent={parent!r}: a node cannot be its own parent")
    return parent


class ForwardingSettings(Protocol):
    """The settings :func:`forwarding_parent` reads (``ServerSettings`` has them): the
    settings import this module, never the other way round."""

    @property
    def tree_index(self) -> int: ...
    @property
    def tree_size(self) -> int: ...
    @property
    def tree_fanout(self) -> int: ...
    @property
    def tree_address_template(self) -> str: ...
    @property
    def parent(self) -> str: ...
    @property
    def listen(self) -> str: ...
    @property
    def forward_timeout_s(self) -> float: ...
    @property
    def upload_deadline_s(self) -> float: ...
    @property
    def forward_threshold_bytes(self) -> int: ...
    @property
    def max_request_bytes(self) -> int: ...
    @property
    def parent_token_file(self) -> str: ...
    @property
    def auth_secret(self) -> str: ...
    @property
    def parent_ca_file(self) -> str: ...

    def is_loopback(self, host: str) -> bool: ...


def forwarding_parent(s: ForwardingSettings) -> str:
    """Validate the forwarding settings of ``s``; return its parent address ("" for none)."""
    if s.tree_index < -1:
        raise ConfigError(f"setting tree_index={s.tree_index}: must be >= -1")
    tree = None
    if s.tree_index >= 0:
        tree = TreeSpec(s.tree_index, s.tree_size, s.tree_fanout, s.tree_address_template)
    parent = resolve_parent(s.parent, tree, s.listen)
    if not parent:  # opt-in: without a parent the forwarding knobs do nothing
        return ""
    if not 0 < s.forward_timeout_s <= s.upload_deadline_s:
        raise ConfigError(
            f"setting forward_timeout_s={s.forward_timeout_s!r}: must be > 0 and <= "
            "upload_deadline_s"
        )
    if not 0 < s.forward_threshold_bytes <= s.max_request_bytes - _REQUEST_ROOM:
        raise ConfigError(
            f"setting forward_threshold_bytes={s.forward_threshold_bytes!r}: must be > 0 and "
            "leave 64 KiB below max_request_bytes"
        )
    host = parent.rpartition(":")[0]
    has_token = bool(s.parent_token_file or s.auth_secret)
    if parent and not s.is_loopback(host) and not (s.parent_ca_file and has_token):
        raise ConfigError(
            f"setting parent={parent!r}: a non-loopback parent needs parent_ca_file (TLS) "
            "and a node token (parent_token_file, or an auth secret shared with the parent)"
        )
    return parent
