"""One writer's calls as unary RPCs: numbered by session and seq, resent while pushed back.

:class:`UnaryTransport` sends ``Append``, ``LastAppendedSqn``,
``PersistDurably`` and ``Truncate`` one RPC each, numbered within a random
``session`` by the writer's ``seq`` so the sidecar applies them in call
order (see the proto). A call that carries changes and is refused with
:class:`~dstl_client.core.errors.BudgetFull` (nothing applied, its turn not
taken) is sent again unchanged, same ``seq``, after
:func:`~dstl_client.transport.retry_delay` and its turn at the client's
:class:`~dstl_client._resend_gate.ResendGate`, for at most the connection's
``timeout_s``; then the refusal is raised.
"""

from __future__ import annotations

import concurrent.futures
import secrets
import threading
import time
from typing import Any

import grpc

from dstl_client._buffer import ChangeBuffer
from dstl_client._resend_gate import PROBE_HOLD_S, GatePass, ResendGate
from dstl_client._status import to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import BudgetFull
from dstl_client.core.handle import ChangelogHandle
from dstl_client.transport import Connection, WriterCalls, retry_delay


class UnaryTransport(WriterCalls):
    """A writer's calls, one RPC each, through the client's resend ``gate``.

    Called under the writer's lock, one call at a time and in call order;
    a persist's future completes on a gRPC callback or timer thread.
    """

    name = "unary"

    def __init__(self, conn: Connection, log_id: str, gate: ResendGate) -> None:
        super().__init__(conn, log_id)
        self._gate = gate
        #: numbers the calls that change the log, within a random session (see the proto)
        self._session = secrets.randbits(63) | 1

    def append(self, seq: int, buffer: ChangeBuffer) -> int:
        request = pb.AppendRequest(log_id=self.log_id, session=self._session, seq=seq)
        buffer.drain_to(request)
        return int(self._with_retry(self.conn.stub.Append, request).sqn)

    def last_appended_sqn(self, seq: int) -> int:
        request = pb.LastAppendedSqnRequest(log_id=self.log_id, session=self._session, seq=seq)
        return int(self.conn.call(self.conn.stub.LastAppendedSqn, request).sqn)

    def persist(
        self, seq: int, after: int, buffer: ChangeBuffer
    ) -> concurrent.futures.Future[ChangelogHandle]:
        request = pb.PersistRequest(log_id=self.log_id, after=after, session=self._session, seq=seq)
        buffer.drain_to(request)
        return _RetriedPersist(self.conn, self._gate, request).future

    def truncate(self, seq: int, before: int) -> None:
        request = pb.TruncateRequest(
            log_id=self.log_id, session=self._session, seq=seq, before=before
        )
        self.conn.call(self.conn.stub.Truncate, request)

    def close(self) -> None:
        self.close_writer()

    def _with_retry(self, method: Any, request: Any) -> Any:
        """A call that carries changes, sent again while refused for a full budget."""
        gate = self._gate
        ticket = GatePass()
        nbytes = request.ByteSize()
        timeout_s = self.conn.timeout_s
        deadline = time.monotonic() + timeout_s
        refusal: BudgetFull | None = None
        attempt = 0
        try:
            while True:
                if not gate.enter(ticket, nbytes, deadline):
                    raise refusal or _not_sent(timeout_s)
                try:
                    return self.conn.call(method, request)
                except BudgetFull as exc:
                    gate.refused(ticket)
                    refusal = exc
                    attempt += 1
                    delay = retry_delay(attempt)
                    if time.monotonic() + delay >= deadline:
                        raise
                    time.sleep(delay)
        finally:
            gate.settled(ticket)


class _RetriedPersist:
    """A unary ``PersistDurably`` sent again (same ``seq``) while refused for a full budget.

    ``future`` gets the handle, or the final call's typed error. Each send
    takes its turn at the client's gate (the first from the caller's thread,
    which raises if it cannot be made at all, e.g. on a closed channel;
    resends from a timer thread after their pause), for at most the
    connection's ``timeout_s`` from the first send.
    """

    def __init__(self, conn: Connection, gate: ResendGate, request: pb.PersistRequest) -> None:
        self._conn = conn
        self._gate = gate
        self._request = request
        self._deadline = time.monotonic() + conn.timeout_s
        self._ticket = GatePass(PROBE_HOLD_S)
        self._nbytes = request.ByteSize()
        self._attempt = 0
        self._refusal: BudgetFull | None = None
        self.future: concurrent.futures.Future[ChangelogHandle] = concurrent.futures.Future()
        self._send()

    def _send(self) -> None:
        # a persist without changes costs the sidecar nothing: it need not wait its turn
        carries = self._request.changes or self._request.HasField("packed")
        if carries and not self._gate.enter(self._ticket, self._nbytes, self._deadline):
            self._finish(None, self._refusal or _not_sent(self._conn.timeout_s))
            return
        try:
            call = self._conn.call_future(self._conn.stub.PersistDurably, self._request)
        except BaseException as exc:  # e.g. the channel is closed
            self._gate.settled(self._ticket)
            if self._attempt == 0:
                raise  # the caller's thread: persist_durably raises it
            self._finish(None, exc)
            return
        call.add_done_callback(self._done)

    def _done(self, call: Any) -> None:
        exc = call.exception()
        if isinstance(exc, grpc.RpcError):
            refusal = to_dstl_error(exc, self._conn.target)
            if isinstance(refusal, BudgetFull):
                self._gate.refused(self._ticket)
                self._refusal = refusal
                self._attempt += 1
                delay = retry_delay(self._attempt)
                if time.monotonic() + delay < self._deadline:
                    timer = threading.Timer(delay, self._send)
                    timer.daemon = True
                    timer.start()
                    return
        self._finish(call, None)

    def _finish(self, call: Any, error: BaseException | None) -> None:
        self._gate.settled(self._ticket)
        if error is None:
            try:
                handle = ChangelogHandle.from_proto(call.result().handle)
            except grpc.RpcError as exc:
                error = to_dstl_error(exc, self._conn.target)
            except BaseException as exc:  # a cancelled call, a bad handle...
                error = exc
            else:
                self.future.set_result(handle)
                return
        self.future.set_exception(error)


def _not_sent(timeout_s: float) -> BudgetFull:
    return BudgetFull(
        f"not sent within {timeout_s:g}s: the client's calls were pushed back by the "
        "sidecar's full memory budget all that time (nothing was applied)"
    )
