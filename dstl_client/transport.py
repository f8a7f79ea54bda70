"""How a client's calls reach the sidecar: one connection, and the writer transports on it.

A :class:`Connection` is one gRPC channel with its credentials, metadata and
per-call deadline; every call of the client goes through it, and it turns a
failed call into the typed error of :mod:`dstl_client.core.errors`.

A writer sends its log calls (``Append``, ``LastAppendedSqn``,
``PersistDurably``, ``Truncate``) through a :class:`WriterTransport` that
:class:`~dstl_client.client.ChangelogClient` builds for it and hands it:
:class:`~dstl_client._stream.StreamTransport` (every writer of the client
on one long-lived ``Mux`` stream) or :class:`~dstl_client._unary.UnaryTransport` (one RPC per
call). Both keep the same promises: calls are applied in the order they are
made, a call refused for a full memory budget is sent again after
:func:`retry_delay` (the caller only sees the delay), and an outcome arrives
as the typed error a unary call would have raised.
"""

from __future__ import annotations

import concurrent.futures
import random
from collections.abc import Iterator
from typing import Any, Protocol

import grpc

from dstl_client._buffer import ChangeBuffer
from dstl_client._status import channel_options, credentials_and_metadata, to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import SidecarUnavailable
from dstl_client.core.handle import ChangelogHandle

__all__ = [
    "RETRY_FIRST_DELAY_S",
    "RETRY_MAX_DELAY_S",
    "Connection",
    "WriterCalls",
    "WriterTransport",
    "retry_delay",
]

#: first pause before a call refused for a full budget is sent again; it doubles up to the maximum
RETRY_FIRST_DELAY_S = 0.02
RETRY_MAX_DELAY_S = 1.0


def retry_delay(attempt: int) -> float:
    """The pause before resend number ``attempt`` (1, 2...): full jitter, doubling, capped."""
    cap = min(RETRY_MAX_DELAY_S, RETRY_FIRST_DELAY_S * 2.0 ** min(attempt - 1, 16))
    return cap * random.uniform(0.5, 1.0)


class Connection:
    """One gRPC channel to a sidecar, with its credentials and per-call deadline.

    ``stub`` names the sidecar's methods; :meth:`call`, :meth:`call_future`,
    :meth:`read_stream`, :meth:`open_session` and :meth:`open_mux` make the calls with the
    connection's metadata (a bearer token) and turn failures into typed
    errors. Thread-safe (gRPC channels are); :meth:`close` ends every call.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None,
        root_certificates: bytes | None,
        timeout_s: float,
        max_message_bytes: int,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        creds, self._metadata = credentials_and_metadata(token, root_certificates)
        options = channel_options(max_message_bytes)
        if creds is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, creds, options=options)
        self.stub = pb_grpc.ChangelogStub(self._channel)  # type: ignore[no-untyped-call]
        # requests go out encoded by the stream (several packed into one message)
        self._mux = self._channel.stream_stream(
            "/dstl.v1.Changelog/Mux", response_deserializer=pb.MuxResponse.FromString
        )

    def call(self, method: Any, request: Any) -> Any:
        """A unary call of ``method`` within ``timeout_s``; failures as typed errors."""
        try:
            return method(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise to_dstl_error(exc, self.target) from None

    def call_future(self, method: Any, request: Any) -> Any:
        """A unary call of ``method`` without deadline, as gRPC's future (raw errors)."""
        return method.future(request, metadata=self._metadata)

    def read_stream(self, method: Any, request: Any) -> Iterator[Any]:
        """The messages of a server-streaming call within ``timeout_s``; failures typed."""
        try:
            yield from method(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise to_dstl_error(exc, self.target) from None

    def open_session(self, requests: Iterator[pb.SessionRequest]) -> Any:
        """A ``Session`` call sending ``requests`` (gRPC's call: iterate it for the answers)."""
        return self.stub.Session(requests, metadata=self._metadata)

    def open_mux(self, messages: Iterator[bytes]) -> Any:
        """A ``Mux`` call sending ``messages`` (each an encoded ``MuxRequest``); gRPC's
        call: iterate it for the ``MuxResponse`` messages."""
        return self._mux(messages, metadata=self._metadata)

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the channel connects (raises SidecarUnavailable)."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise SidecarUnavailable(
                f"no sidecar answered at {self.target} in {timeout_s}s"
            ) from None

    def close(self) -> None:
        self._channel.close()


class WriterTransport(Protocol):
    """How one writer's calls reach the sidecar (see the module docs).

    The writer calls it under its own lock, one call at a time and in call
    order; ``seq`` numbers the calls that change the log (a transport that
    needs no numbering ignores it). A method raises the typed error of its
    call; :meth:`persist`'s outcome arrives through its future, completed on
    a gRPC or timer thread.
    """

    #: ``"stream"`` or ``"unary"`` (the client's ``transport`` setting)
    name: str

    def append(self, seq: int, buffer: ChangeBuffer) -> int:
        """Send the buffered changes (the buffer is drained); the SQN after them."""
        ...

    def last_appended_sqn(self, seq: int) -> int:
        """Close the current changeset; the boundary SQN."""
        ...

    def persist(
        self, seq: int, after: int, buffer: ChangeBuffer
    ) -> concurrent.futures.Future[ChangelogHandle]:
        """Send a persist carrying the buffered changes; the future of its handle."""
        ...

    def truncate(self, seq: int, before: int) -> None:
        """Changes with SQN < ``before`` are no longer needed."""
        ...

    def close(self) -> None:
        """End the writer on the sidecar (answers still due arrive first)."""
        ...


class WriterCalls:
    """What both transports share: the connection, the log, and ``CloseWriter``."""

    def __init__(self, conn: Connection, log_id: str) -> None:
        self.conn = conn
        self.log_id = log_id

    def close_writer(self) -> None:
        self.conn.call(self.conn.stub.CloseWriter, pb.CloseWriterRequest(log_id=self.log_id))
