"""Per-method gRPC metrics: a ``grpc.aio`` server interceptor.

Every call the server answers (Changelog, health, reflection; refused ones
included) is counted in ``dstl_grpc_requests_total{method, code}`` and timed in
``dstl_grpc_request_seconds{method}``; ``dstl_grpc_requests_in_flight{method}``
counts the calls running. A stream counts once, when it ends, and its duration
is its lifetime (a writer's ``Session`` stream may live for hours).

Label cardinality stays bounded: ``method`` is a method the server has a
handler for (a fixed set), every other name a client may send is ``other``;
``code`` is one of gRPC's 17 status codes.

Installed first (outermost) in :meth:`DstlServer.start`, so calls refused by
the token interceptor count too. Runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from dstl_server.metrics import ServerMetrics

#: the ``method`` label of calls to a method the server has no handler for
UNKNOWN_METHOD = "other"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


def method_label(full_method: str) -> str:
    """``/dstl.v1.Changelog/Append`` -> ``dstl.v1.Changelog/Append``."""
    return full_method.lstrip("/")


def _code_of(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    """The status the call ended with, as its name (``OK``, ``NOT_FOUND`` ...)."""
    if isinstance(error, asyncio.CancelledError | GeneratorExit):  # the client went away
        return "CANCELLED"
    code: Any = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if isinstance(code, int):  # grpc.aio may hand back the raw cygrpc code
        for status in grpc.StatusCode:
            if status.value[0] == code:
                return str(status.name)
    # no code set: an exception that is no abort is UNKNOWN to the client
    return "OK" if error is None else "UNKNOWN"


class GrpcMetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts and times every call by method and status code (see the module doc)."""

    def __init__(self, metrics: ServerMetrics, clock: Callable[[], float] = time.perf_counter):
        self._metrics = metrics
        self._clock = clock

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # grpc answers UNIMPLEMENTED; the name is the client's: not a label
            self._metrics.grpc_requests.labels(
                UNKNOWN_METHOD, grpc.StatusCode.UNIMPLEMENTED.name
            ).inc()
            return None
        return self._wrap(method_label(handler_call_details.method or ""), handler)

    # ------------------------------------------------------------ wrapping
    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(method, handler.stream_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(method, handler.unary_stream),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(method, handler.stream_stream),
            handler.request_deserializer,
            handler.response_serializer,
        )

    def _begin(self, method: str) -> float:
        self._metrics.grpc_in_flight.labels(method).inc()
        return self._clock()

    def _end(
        self,
        method: str,
        started: float,
        context: grpc.aio.ServicerContext,
        error: BaseException | None,
    ) -> None:
        m = self._metrics
        m.grpc_in_flight.labels(method).dec()
        m.grpc_request_seconds.labels(method).observe(self._clock() - started)
        m.grpc_requests.labels(method, _code_of(context, error)).inc()

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        """A handler that answers once (unary or client-streaming request)."""

        async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = self._begin(method)
            error: BaseException | None = None
            try:
                return await behavior(request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._end(method, started, context, error)

        return timed

    def _streaming(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        """A server-streaming handler: an async generator, or a coroutine using ``context.write``."""
        if inspect.isasyncgenfunction(behavior):

            async def timed_gen(
                request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                started = self._begin(method)
                error: BaseException | None = None
                try:
                    async for response in behavior(request, context):
                        yield response
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    self._end(method, started, context, error)

            return timed_gen
        # the reader/writer form (``Session``): answers go out by context.write
        return self._unary(method, behavior)
