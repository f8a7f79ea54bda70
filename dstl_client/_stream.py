"""One writer's ``Session`` stream on the client: requests in call order, answers by id.

:class:`StreamTransport`, the default transport of
:class:`~dstl_client.writer.ChangelogWriter` for
``Append``, ``LastAppendedSqn``, ``PersistDurably`` and ``Truncate``: one
long-lived bidirectional gRPC stream per writer, opened at the writer's first
such call. The sidecar applies a stream's requests in the order they were
sent, so the stream needs no ``session``/``seq``; each answer names its
request's id.

Threads: gRPC's own thread sends the queued requests (HTTP/2 flow control
may hold it: backpressure), and one reader thread per gRPC call completes
each request's future with its answer (a refused request: the typed error
its unary call would have raised). A stream that ends, for whatever reason,
fails every request still waiting on it with the error it ended with
(:class:`~dstl_client.core.errors.SidecarUnavailable` for a lost connection,
a cancelled call or a stream ended without a status); the writer treats
that exactly like a lost unary call, and opens a new stream for its next
call if it is not failed by then.

**A full memory budget** (:class:`~dstl_client.core.errors.BudgetFull`): the
sidecar applied neither the refused request nor any later one of that gRPC
call (it refuses them all), so the stream sends them again, in order, on a
new gRPC call after a pause (jittered, doubling from
:data:`~dstl_client.transport.RETRY_FIRST_DELAY_S` up to
:data:`~dstl_client.transport.RETRY_MAX_DELAY_S`); their futures
stay the same and the caller only sees the delay. The old call is
half-closed and still delivers the answers of the requests before the
refused one. The sidecar decides when it has been too long (a plain
:class:`~dstl_client.core.errors.Backpressure`, which fails the request);
the stream also stops resending after ``retry_limit_s`` without an accepted
request and fails the request with the refusal.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from dstl_client._buffer import ChangeBuffer
from dstl_client._status import to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    BudgetFull,
    DstlError,
    SidecarUnavailable,
    error_class_for_kind,
)
from dstl_client.core.handle import ChangelogHandle
from dstl_client.transport import Connection, WriterCalls, retry_delay


def error_of(error: pb.SessionError) -> DstlError:
    """The typed error a refused stream request stands for (as its unary call's status)."""
    return error_class_for_kind(error.kind)(error.message or error.code or "refused")


@dataclass(slots=True)
class _Entry:
    """A request and the future of its answer (the same across resends)."""

    request: pb.SessionRequest
    future: concurrent.futures.Future[pb.SessionResponse]


class _Leg:
    """One gRPC ``Session`` call of the stream."""

    def __init__(self, conn: Connection) -> None:
        self.requests: queue.SimpleQueue[pb.SessionRequest | None] = queue.SimpleQueue()
        #: unanswered requests by id, in the order sent
        self.pending: dict[int, _Entry] = {}
        #: ids moved to a later leg: their refusals here are expected and ignored
        self.moved: set[int] = set()
        self.call = conn.open_session(self._outgoing())

    def _outgoing(self) -> Iterator[pb.SessionRequest]:
        """The requests, as gRPC's sending thread takes them; ``None`` half-closes."""
        while True:
            request = self.requests.get()
            if request is None:
                return
            yield request


class WriterStream:
    """One writer's stream: :meth:`submit` a request, get a future of its answer.

    Thread-safe; the writer submits under its own lock, so requests reach the
    stream in call order. ``broken`` is the error the stream ended with (then
    :meth:`submit` raises it; the writer opens a new stream). Requests
    refused for a full budget are sent again (see the module docs): while
    a resend waits for its pause, new requests queue behind it.
    """

    def __init__(self, conn: Connection, log_id: str) -> None:
        self._conn = conn
        self._target = conn.target
        self._name = f"dstl-stream-{log_id[:12]}"
        self.retry_limit_s = conn.timeout_s
        self._lock = threading.Lock()
        self._last_id = 0
        self.broken: DstlError | None = None
        self._closing = False
        #: requests waiting for a resend's pause to end (None: not resending)
        self._held: list[_Entry] | None = None
        self._attempt = 0
        self._refused_since: float | None = None
        self._legs: set[_Leg] = set()
        #: the reader threads of the calls still open (a blocking call must not run there)
        self._readers: set[threading.Thread] = set()
        self._leg: _Leg | None = None
        with self._lock:  # its reader may end at once (no sidecar): it looks at _leg
            self._leg = self._open_leg()

    def _open_leg(self) -> _Leg:
        """A new gRPC call and its reader thread (under the lock, or in ``__init__``)."""
        leg = _Leg(self._conn)
        self._legs.add(leg)
        reader = threading.Thread(target=self._read, args=(leg,), name=self._name, daemon=True)
        self._readers.add(reader)
        reader.start()
        return leg

    def _send(self, leg: _Leg, entry: _Entry) -> None:
        self._last_id += 1
        entry.request.id = self._last_id
        leg.pending[self._last_id] = entry
        leg.requests.put(entry.request)

    def submit(self, request: pb.SessionRequest) -> concurrent.futures.Future[pb.SessionResponse]:
        """Queue ``request`` (its id is set here); the future of its answer."""
        entry = _Entry(request, concurrent.futures.Future())
        with self._lock:
            if self.broken is not None:
                raise self.broken
            if self._held is not None:
                self._held.append(entry)
            else:
                assert self._leg is not None
                self._send(self._leg, entry)
        return entry.future

    def call(self, request: pb.SessionRequest, timeout_s: float) -> pb.SessionResponse:
        """Submit ``request`` and wait for its answer; none within ``timeout_s`` is unavailable.

        A request whose answer does not come is treated as a unary call past
        its deadline: the stream is cancelled (its other requests fail too).
        """
        if threading.current_thread() in self._readers:
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

    # ------------------------------------------------------------ answers
    def _read(self, leg: _Leg) -> None:
        error: DstlError
        try:
            for response in leg.call:
                if response.HasField("error") and response.error.kind == BudgetFull.kind:
                    self._refused(leg, response)
                    continue
                with self._lock:
                    entry = leg.pending.pop(response.id, None)
                    if entry is not None and leg is self._leg:
                        self._refused_since = None  # accepted: the budget has room again
                        self._attempt = 0
                if entry is None:
                    if response.id not in leg.moved:  # not ours: the stream is out of step
                        leg.call.cancel()
                    continue
                if response.HasField("error"):
                    entry.future.set_exception(error_of(response.error))
                else:
                    entry.future.set_result(response)
            error = SidecarUnavailable(f"the sidecar at {self._target} ended the writer's stream")
        except grpc.RpcError as exc:
            error = to_dstl_error(exc, self._target)
        except BaseException as exc:  # pragma: no cover - a bug: fail loudly, never hang
            error = DstlError(f"the writer's stream failed: {exc!r}")
        with self._lock:
            self._legs.discard(leg)
            self._readers.discard(threading.current_thread())
            pending = list(leg.pending.values())
            leg.pending.clear()
            if leg is self._leg:  # the current call ended: the stream is broken
                self.broken = error
                self._leg = None
                pending += self._held or ()
                self._held = None
        leg.requests.put(None)  # ends gRPC's sending thread
        for entry in pending:
            entry.future.set_exception(error)

    def _refused(self, leg: _Leg, response: pb.SessionResponse) -> None:
        """A request refused for a full budget: resend it and the later ones, or give up."""
        refusal = error_of(response.error)
        with self._lock:
            if response.id in leg.moved:
                return  # a later request of a call already given up
            entry = leg.pending.get(response.id)
            if entry is None or leg is not self._leg:
                leg.call.cancel()  # out of step
                return
            now = time.monotonic()
            if self._refused_since is None:
                self._refused_since = now
            # this one and every later request: the sidecar applied none of them
            ids = [i for i in leg.pending if i >= response.id]
            later = [leg.pending.pop(i) for i in ids]
            leg.moved.update(ids)
            leg.requests.put(None)  # half-close: earlier answers still come
            self._leg = None
            if now - self._refused_since >= self.retry_limit_s:
                self.broken = refusal  # the writer's next call opens a new stream
                give_up = later
            else:  # send them again, in order, on a new call after a pause
                give_up = []
                self._held = later
                self._attempt += 1
                timer = threading.Timer(retry_delay(self._attempt), self._resume)
                timer.daemon = True
                timer.start()
        for entry in give_up:
            entry.future.set_exception(refusal)

    def _resume(self) -> None:
        """After the pause: a new gRPC call with the held requests, in order."""
        failed: list[_Entry] = []
        with self._lock:
            held, self._held = self._held or [], None
            if self.broken is not None:
                failed, error = held, self.broken
            else:
                try:
                    leg = self._leg = self._open_leg()
                except Exception as exc:  # e.g. the client's channel was closed
                    self.broken = error = SidecarUnavailable(
                        f"the writer's stream to {self._target} could not be opened again: {exc!r}"
                    )
                    failed = held
                else:
                    for entry in held:
                        self._send(leg, entry)
                    if self._closing:
                        leg.requests.put(None)
        for entry in failed:
            entry.future.set_exception(error)

    # ------------------------------------------------------------ ending
    def close(self) -> None:
        """Half-close: the sidecar answers what it has, then ends the stream."""
        with self._lock:
            self._closing = True
            if self._leg is not None:
                self._leg.requests.put(None)

    def cancel(self) -> None:
        """Tear the stream down now; requests still waiting fail (SidecarUnavailable)."""
        with self._lock:
            error = SidecarUnavailable(f"the writer's stream to {self._target} was cancelled")
            if self.broken is None:
                self.broken = error
            held, self._held = self._held or [], None
            legs = list(self._legs)
        for entry in held:
            entry.future.set_exception(self.broken or error)
        for leg in legs:
            leg.call.cancel()


class StreamTransport(WriterCalls):
    """A writer's calls on its own :class:`WriterStream`, opened at the first call.

    Called under the writer's lock (one call at a time, in call order): a
    stream that ended is replaced by a new one at the next call. Blocking
    calls wait for their answer up to the connection's ``timeout_s``.
    """

    name = "stream"

    def __init__(self, conn: Connection, log_id: str) -> None:
        super().__init__(conn, log_id)
        self._stream: WriterStream | None = None

    def _open(self) -> WriterStream:
        """The writer's stream; a new one if it has none or it ended."""
        stream = self._stream
        if stream is None or stream.broken is not None:
            stream = self._stream = WriterStream(self.conn, self.log_id)
        return stream

    def _call(self, request: pb.SessionRequest) -> pb.SessionResponse:
        return self._open().call(request, self.conn.timeout_s)

    def append(self, seq: int, buffer: ChangeBuffer) -> int:
        request = pb.SessionRequest()
        request.append.log_id = self.log_id
        buffer.drain_into(request.append.changes)
        return int(self._call(request).sqn)

    def last_appended_sqn(self, seq: int) -> int:
        request = pb.SessionRequest()
        request.last_appended_sqn.CopyFrom(pb.LastAppendedSqnRequest(log_id=self.log_id))
        return int(self._call(request).sqn)

    def persist(
        self, seq: int, after: int, buffer: ChangeBuffer
    ) -> concurrent.futures.Future[ChangelogHandle]:
        request = pb.SessionRequest()
        persist = request.persist
        persist.log_id = self.log_id
        persist.after = after
        buffer.drain_into(persist.changes)
        answer = self._open().submit(request)
        handle: concurrent.futures.Future[ChangelogHandle] = concurrent.futures.Future()

        def settle(done: concurrent.futures.Future[pb.SessionResponse]) -> None:
            try:
                handle.set_result(ChangelogHandle.from_proto(done.result().handle))
            except BaseException as exc:  # a refusal, a lost stream, a bad handle
                handle.set_exception(exc)

        answer.add_done_callback(settle)
        return handle

    def truncate(self, seq: int, before: int) -> None:
        request = pb.SessionRequest()
        request.truncate.CopyFrom(pb.TruncateRequest(log_id=self.log_id, before=before))
        self._call(request)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()  # answers still due arrive; then it ends
            self._stream = None
        self.close_writer()
