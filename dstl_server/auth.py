"""Shared-token authentication for gRPC calls (off unless a token is set)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Rejects calls without ``authorization: Bearer <token>`` (health checks pass).

    Stateless; runs on the server's event loop for every call.
    """

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        if method.startswith(_OPEN_PREFIXES):
            return await continuation(handler_call_details)
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(got, self._expected):
                    return await continuation(handler_call_details)
        return _deny(await continuation(handler_call_details))


def _deny(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong token",
            trailing_metadata=(("dstl-error-kind", "permission_denied"),),
        )

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong token",
            trailing_metadata=(("dstl-error-kind", "permission_denied"),),
        )
        yield None  # pragma: no cover

    deser = handler.request_deserializer if handler else None
    ser = handler.response_serializer if handler else None
    if handler is not None and handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream, deser, ser)
    return grpc.unary_unary_rpc_method_handler(unary, deser, ser)
