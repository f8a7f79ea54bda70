"""The dstl sidecar: a per-node asyncio gRPC service batching state changes into objects.

``DstlServer`` and ``ServerSettings`` are imported on first use, so that a
module of the package that needs neither (``dstl-server health``, the exec
probe) starts without grpcio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dstl_server.app import DstlServer
    from dstl_server.settings import ServerSettings

__all__ = ["DstlServer", "ServerSettings"]


def __getattr__(name: str) -> Any:
    if name == "DstlServer":
        from dstl_server.app import DstlServer

        return DstlServer
    if name == "ServerSettings":
        from dstl_server.settings import ServerSettings

        return ServerSettings
    raise AttributeError(f"module 'dstl_server' has no attribute {name!r}")
