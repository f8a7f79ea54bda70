"""One writer's ``Session`` stream on the client: requests in call order, answers by id.

The default transport of :class:`~dstl_client.writer.ChangelogWriter` for
``Append``, ``LastAppendedSqn``, ``PersistDurably`` and ``Truncate``: one
long-lived bidirectional gRPC stream per writer, opened at the writer's first
such call. The sidecar applies a stream's requests in the order they were
sent, so the stream needs no ``session``/``seq``; each answer names its
request's id.

Threads: gRPC's own thread sends the queued requests (HTTP/2 flow control
may hold it: backpressure), and one reader thread per stream completes each
request's future with its answer (a refused request: the typed error its
unary call would have raised). A stream that ends, for whatever reason,
fails every request still waiting on it with the error it ended with
(:class:`~dstl_client.core.errors.SidecarUnavailable` for a lost connection,
a cancelled call or a stream ended without a status); the writer treats
that exactly like a lost unary call, and opens a new stream for its next
call if it is not failed by then.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc

from dstl_client._status import to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import DstlError, SidecarUnavailable, error_class_for_kind

if TYPE_CHECKING:
    from dstl_client.client import ChangelogClient


def error_of(error: pb.SessionError) -> DstlError:
    """The typed error a refused stream request stands for (as its unary call's status)."""
    return error_class_for_kind(error.kind)(error.message or error.code or "refused")


class WriterStream:
    """One ``Session`` stream: :meth:`submit` a request, get a future of its answer.

    Thread-safe; the writer submits under its own lock, so requests reach the
    stream in call order. ``broken`` is the error the stream ended with (then
    :meth:`submit` raises it; the writer opens a new stream).
    """

    def __init__(self, client: ChangelogClient, log_id: str) -> None:
        self._target = client.target
        self._requests: queue.SimpleQueue[pb.SessionRequest | None] = queue.SimpleQueue()
        self._pending: dict[int, concurrent.futures.Future[pb.SessionResponse]] = {}
        self._last_id = 0
        self._lock = threading.Lock()
        self.broken: DstlError | None = None
        self._call = client._stub.Session(self._outgoing(), metadata=client._metadata)
        self.reader = threading.Thread(
            target=self._read, name=f"dstl-stream-{log_id[:12]}", daemon=True
        )
        self.reader.start()

    def _outgoing(self) -> Iterator[pb.SessionRequest]:
        """The requests, as gRPC's sending thread takes them; ``None`` half-closes."""
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def submit(self, request: pb.SessionRequest) -> concurrent.futures.Future[pb.SessionResponse]:
        """Queue ``request`` (its id is set here); the future of its answer."""
        future: concurrent.futures.Future[pb.SessionResponse] = concurrent.futures.Future()
        with self._lock:
            if self.broken is not None:
                raise self.broken
            self._last_id += 1
            request.id = self._last_id
            self._pending[self._last_id] = future
            self._requests.put(request)
        return future

    def call(self, request: pb.SessionRequest, timeout_s: float) -> pb.SessionResponse:
        """Submit ``request`` and wait for its answer; none within ``timeout_s`` is unavailable.

        A request whose answer does not come is treated as a unary call past
        its deadline: the stream is cancelled (its other requests fail too).
        """
        if threading.current_thread() is self.reader:
            raise DstlError(
                "a blocking call of a writer was made from a callback of that writer's own "
                "persist future (the thread that delivers the writer's answers): it would "
                "wait forever; call it from another thread"
            )
        future = self.submit(request)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            if future.done():  # answered just now
                return future.result()
            self.cancel()
            raise SidecarUnavailable(
                f"sidecar at {self._target} unavailable (DEADLINE_EXCEEDED): no answer on the "
                f"writer's stream within {timeout_s:g}s"
            ) from None

    def _read(self) -> None:
        error: DstlError
        try:
            for response in self._call:
                with self._lock:
                    future = self._pending.pop(response.id, None)
                if future is None:  # not a request of ours: the stream is out of step
                    self._call.cancel()
                    continue
                if response.HasField("error"):
                    future.set_exception(error_of(response.error))
                else:
                    future.set_result(response)
            error = SidecarUnavailable(f"the sidecar at {self._target} ended the writer's stream")
        except grpc.RpcError as exc:
            error = to_dstl_error(exc, self._target)
        except BaseException as exc:  # pragma: no cover - a bug: fail loudly, never hang
            error = DstlError(f"the writer's stream failed: {exc!r}")
        with self._lock:
            self.broken = error
            pending, self._pending = self._pending, {}
        self._requests.put(None)  # ends gRPC's sending thread
        for future in pending.values():
            future.set_exception(error)

    def close(self) -> None:
        """Half-close: the sidecar answers what it has, then ends the stream."""
        self._requests.put(None)

    def cancel(self) -> None:
        """Tear the stream down now; requests still waiting fail (SidecarUnavailable)."""
        self._call.cancel()
