"""The dstl sidecar: a per-node asyncio gRPC service batching state changes into objects."""

from dstl_server.app import DstlServer
from dstl_server.settings import ServerSettings

__all__ = ["DstlServer", "ServerSettings"]
