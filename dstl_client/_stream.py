"""Every writer of a client on one ``Mux`` stream: requests in call order, answers by id.

:class:`StreamTransport`, the default transport of
:class:`~dstl_client.writer.ChangelogWriter` for ``Append``,
``LastAppendedSqn``, ``PersistDurably`` and ``Truncate``, sends a writer's
calls on its client's :class:`MuxStream`: one long-lived bidirectional gRPC
stream per client (per process, as a PySpark worker shares one client),
opened at the first such call of any of its writers. Each request names its
writer; the sidecar applies each writer's requests in the order they were
sent (no ``session``/``seq``) and answers each by its id. Requests queued
together leave in one message (:mod:`dstl_client._mux_leg`), and the sidecar
answers every persist completed by one of its flushes in one message.

Threads: gRPC's own thread sends the queued requests (HTTP/2 flow control
may hold it: backpressure), and one reader thread per gRPC call completes
each request's future with its answer (a refused request: the typed error
its unary call would have raised; a refusal is the writer's alone, its
siblings go on). A call that ends, for whatever reason, fails every request
still waiting on it, of every writer, with the error it ended with
(:class:`~dstl_client.core.errors.SidecarUnavailable` for a lost connection,
a cancelled call or a stream ended without a status); a writer treats that
exactly like a lost unary call, and the next request of any writer opens a
new gRPC call. A blocking call with no answer within ``timeout_s`` fails its
writer alone if the call answered others meanwhile, else cancels the call.

**A full memory budget** (:class:`~dstl_client.core.errors.BudgetFull`): the
sidecar applied neither the refused request nor any later one of that
writer (it refuses them all, until one comes with ``resend`` set), so the
stream sends them again, in order, after a pause (jittered, doubling from
:data:`~dstl_client.transport.RETRY_FIRST_DELAY_S` up to
:data:`~dstl_client.transport.RETRY_MAX_DELAY_S`), the first with
``resend``; their futures stay the same and the caller only sees the delay.
The other writers' requests go on meanwhile. The sidecar decides when it has
been too long (a plain :class:`~dstl_client.core.errors.Backpressure`,
which fails the request); the stream also stops resending after
``retry_limit_s`` without an accepted request of that writer and fails the
request with the refusal.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import grpc

from dstl_client._buffer import ChangeBuffer
from dstl_client._mux_leg import Entry, MuxLane, MuxLeg
from dstl_client._status import to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import (
    BudgetFull,
    ConfigError,
    DstlError,
    SidecarUnavailable,
    error_class_for_kind,
)
from dstl_client.core.handle import ChangelogHandle
from dstl_client.transport import Connection, WriterCalls, retry_delay


def error_of(error: pb.SessionError) -> DstlError:
    """The typed error a refused stream request stands for (as its unary call's status)."""
    return error_class_for_kind(error.kind)(error.message or error.code or "refused")


class MuxStream:
    """A client's writer stream: :meth:`submit` a writer's request, get a future of its answer.

    Thread-safe; a writer submits under its own lock, so each writer's
    requests reach the stream in its call order. At most one gRPC call is
    current (``_leg``); it is opened at the first request after the last
    one ended. Requests of a writer refused for a full budget are sent again
    (see the module docs): while that writer's resend waits for its pause,
    its new requests queue behind it (``MuxLane.held``). Ids are unique on
    the stream and increase in the order requests are put on a call.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._target = conn.target
        self.retry_limit_s = conn.timeout_s
        self._lock = threading.Lock()
        self._last_id = 0
        self._leg: MuxLeg | None = None
        self._legs: set[MuxLeg] = set()
        #: lanes whose resend waits for its pause (failed if the call ends meanwhile)
        self._holding: set[MuxLane] = set()
        #: the reader threads of the calls still open (a blocking call must not run there)
        self._readers: set[threading.Thread] = set()
        self._closed = False
        #: answer messages and answers received, over every call (reader threads count)
        self.messages_received = 0
        self.answers_received = 0

    # ------------------------------------------------------------ requests
    def _open_leg(self) -> MuxLeg:
        """A new gRPC call and its reader thread (under the lock)."""
        try:
            leg = MuxLeg(self._conn)
        except Exception as exc:  # e.g. the client's channel was closed
            raise SidecarUnavailable(
                f"the writer stream to {self._target} could not be opened: {exc!r}"
            ) from None
        self._legs.add(leg)
        reader = threading.Thread(
            target=self._read, args=(leg,), name="dstl-mux-reader", daemon=True
        )
        self._readers.add(reader)
        reader.start()
        return leg

    def _send(self, leg: MuxLeg, entry: Entry) -> None:
        """Put ``entry`` on ``leg`` with a new id (under the lock)."""
        self._last_id += 1
        if entry.queued:  # sent before: the leg's queue may still hold that object
            request = pb.SessionRequest()
            request.CopyFrom(entry.request)
            entry.request = request
        entry.queued = True
        request = entry.request
        request.id = self._last_id
        lane = entry.lane
        request.resend = lane.resend_next
        lane.resend_next = False
        leg.pending[self._last_id] = entry
        leg.requests.put(request)

    def submit(
        self, lane: MuxLane, request: pb.SessionRequest
    ) -> concurrent.futures.Future[pb.SessionResponse]:
        """Queue ``request`` of ``lane``'s writer (its id is set here); the future of its answer."""
        entry = Entry(request, lane)
        with self._lock:
            if lane.held is not None:
                lane.held.append(entry)
            else:
                leg = self._leg
                if leg is None:
                    leg = self._leg = self._open_leg()
                self._send(leg, entry)
        return entry.future

    def call(
        self, lane: MuxLane, request: pb.SessionRequest, timeout_s: float
    ) -> pb.SessionResponse:
        """Submit ``request`` and wait for its answer; none within ``timeout_s``: as a unary
        call past its deadline, :meth:`abandon` its writer (the call answered something
        since) or :meth:`cancel` the call (it answered nothing)."""
        if threading.current_thread() in self._readers:
            raise DstlError(
                "a blocking call of a writer was made from a callback of a persist future "
                "of the same client (the thread that delivers its writers' answers): it "
                "would wait forever; call it from another thread"
            )
        submitted = time.monotonic()
        future = self.submit(lane, request)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            if future.done():  # answered just now
                return future.result()
        with self._lock:
            alive = any(leg.last_received >= submitted for leg in self._legs)
        why = (  # alive: the stream answers the other writers, only this writer's call is lost
            f"no answer to writer {lane.log_id}'s request within {timeout_s:g}s, while the "
            "writer stream answered others (they go on)"
            if alive
            else f"no answer on the writer stream within {timeout_s:g}s"
        )
        error = SidecarUnavailable(
            f"sidecar at {self._target} unavailable (DEADLINE_EXCEEDED): {why}"
        )
        if alive:
            self.abandon(lane, error)
        else:
            self.cancel()
        raise error

    def abandon(self, lane: MuxLane, error: DstlError) -> None:
        """Give up ``lane``'s requests (waiting, or held for a resend): each fails with
        ``error`` and a late answer to it is dropped; the other writers' go on."""
        failed: list[Entry] = []
        with self._lock:
            for leg in self._legs:
                ids = [i for i, e in leg.pending.items() if e.lane is lane]
                failed += [leg.pending.pop(i) for i in ids]
                leg.moved.update(ids)
            failed += lane.held or ()
            lane.held = None
            self._holding.discard(lane)
        for entry in failed:
            entry.future.set_exception(error)

    # ------------------------------------------------------------ answers
    def _read(self, leg: MuxLeg) -> None:
        error: DstlError
        try:
            for message in leg.call:
                self._answers(leg, message.answers)
            error = SidecarUnavailable(f"the sidecar at {self._target} ended the writer stream")
        except grpc.RpcError as exc:
            error = to_dstl_error(exc, self._target)
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                error = ConfigError(
                    f"the sidecar at {self._target} does not serve the Mux writer stream (it "
                    "predates this client): upgrade it, or use transport='unary'"
                )
        except BaseException as exc:  # pragma: no cover - a bug: fail loudly, never hang
            error = DstlError(f"the writer stream failed: {exc!r}")
        failed: list[Entry] = []
        with self._lock:
            self._legs.discard(leg)
            self._readers.discard(threading.current_thread())
            failed += leg.pending.values()
            leg.pending.clear()
            if leg is self._leg:  # the current call ended: resends wait no more
                failed += self._detach()
        leg.requests.put(None)  # ends gRPC's sending thread
        for entry in failed:
            entry.future.set_exception(error)

    def _answers(self, leg: MuxLeg, answers: list[pb.SessionResponse]) -> None:
        """Settle the futures of one message's answers (a budget refusal: resend)."""
        self.messages_received += 1
        self.answers_received += len(answers)
        settled: list[tuple[Entry, pb.SessionResponse]] = []
        refused: list[pb.SessionResponse] = []
        with self._lock:
            leg.last_received = time.monotonic()
            current = leg is self._leg
            for answer in answers:
                if answer.HasField("error") and answer.error.kind == BudgetFull.kind:
                    refused.append(answer)
                    continue
                entry = leg.pending.pop(answer.id, None)
                if entry is None:
                    if answer.id not in leg.moved:  # not ours: the stream is out of step
                        leg.call.cancel()
                    continue
                if current and entry.lane.refused_since is not None:
                    entry.lane.refused_since = None  # accepted: the budget has room again
                    entry.lane.attempt = 0
                settled.append((entry, answer))
        for entry, answer in settled:
            if answer.HasField("error"):
                entry.future.set_exception(error_of(answer.error))
            else:
                entry.future.set_result(answer)
        for answer in refused:
            self._refused(leg, answer)

    def _refused(self, leg: MuxLeg, answer: pb.SessionResponse) -> None:
        """A request refused for a full budget: resend it and its writer's later ones, or
        give up."""
        refusal = error_of(answer.error)
        with self._lock:
            if answer.id in leg.moved:
                return  # a later request of a writer already being sent again
            entry = leg.pending.get(answer.id)
            if entry is None or leg is not self._leg:
                leg.call.cancel()  # out of step
                return
            lane = entry.lane
            now = time.monotonic()
            if lane.refused_since is None:
                lane.refused_since = now
            # this one and every later request of the writer: the sidecar applied none
            ids = [i for i, e in leg.pending.items() if e.lane is lane and i >= answer.id]
            later = [leg.pending.pop(i) for i in ids]
            leg.moved.update(ids)
            lane.resend_next = True
            if now - lane.refused_since >= self.retry_limit_s:
                give_up = later  # the writer's next request is sent, with resend
                lane.refused_since = None
                lane.attempt = 0
            else:  # send them again, in order, after a pause
                give_up = []
                lane.held = later
                self._holding.add(lane)
                lane.attempt += 1
                timer = threading.Timer(retry_delay(lane.attempt), self._resume, (lane,))
                timer.daemon = True
                timer.start()
        for refused in give_up:
            refused.future.set_exception(refusal)

    def _resume(self, lane: MuxLane) -> None:
        """After the pause: the held requests of ``lane``, in order, the first with resend."""
        failed: list[Entry] = []
        error: DstlError | None = None
        with self._lock:
            held, lane.held = lane.held, None
            self._holding.discard(lane)
            if not held:
                return  # the call ended meanwhile: they failed with it
            try:
                leg = self._leg
                if leg is None:
                    leg = self._leg = self._open_leg()
            except DstlError as exc:
                failed, error = held, exc
            else:
                for entry in held:
                    self._send(leg, entry)
                if self._closed:
                    leg.requests.put(None)
        for entry in failed:
            entry.future.set_exception(error or DstlError("resend failed"))

    # ------------------------------------------------------------ ending
    def close(self) -> None:
        """Half-close: the sidecar answers what it has, then ends the stream."""
        with self._lock:
            self._closed = True
            if self._leg is not None:
                self._leg.requests.put(None)
                self._leg = None

    def cancel(self) -> None:
        """Tear the current call down now (its waiting requests fail); the next opens anew."""
        with self._lock:
            legs = list(self._legs)
            held = self._detach() if self._leg is not None else []
        for leg in legs:
            leg.call.cancel()
        error = SidecarUnavailable(f"the writer stream to {self._target} was cancelled")
        for entry in held:
            entry.future.set_exception(error)

    def _detach(self) -> list[Entry]:
        """Make the current call not current (under the lock); its held resends, to fail."""
        self._leg = None
        failed: list[Entry] = []
        for lane in self._holding:
            failed += lane.held or ()
            lane.held = None
            lane.attempt = 0
            lane.refused_since = None
        self._holding.clear()
        return failed


class StreamTransport(WriterCalls):
    """A writer's calls on its client's :class:`MuxStream` (see the module docs).

    Called under the writer's lock (one call at a time, in call order).
    Blocking calls wait for their answer up to the connection's ``timeout_s``.
    """

    name = "stream"

    def __init__(self, conn: Connection, log_id: str, stream: MuxStream) -> None:
        super().__init__(conn, log_id)
        self._stream = stream
        self._lane = MuxLane(log_id)

    def _call(self, request: pb.SessionRequest) -> pb.SessionResponse:
        return self._stream.call(self._lane, request, self.conn.timeout_s)

    def append(self, seq: int, buffer: ChangeBuffer) -> int:
        request = pb.SessionRequest()
        request.append.log_id = self.log_id
        buffer.drain_to(request.append)
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
        buffer.drain_to(persist)
        answer = self._stream.submit(self._lane, request)
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
        self.close_writer()  # answers still due arrive on the client's stream
