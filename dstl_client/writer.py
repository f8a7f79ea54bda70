"""A writer: the log of one state backend instance, as its client sees it.

Created by :meth:`dstl_client.client.ChangelogClient.create_writer`. See the
class docstring for the call-order, batching and sticky-failure rules.
"""

from __future__ import annotations

import concurrent.futures
import threading
from array import array
from collections.abc import Callable, Iterable
from itertools import islice
from typing import TypeVar

from dstl_client._buffer import PART_FRAMING_BYTES, ChangeBuffer, fit_sizes
from dstl_client.core.errors import (
    CallLost,
    ChangeTooLarge,
    DstlError,
    InvalidArgument,
    ShuttingDown,
    SidecarUnavailable,
    UploadFailed,
    WriterClosed,
    WriterFailed,
)
from dstl_client.core.format import MAX_PARTS_PER_REQUEST
from dstl_client.core.handle import ChangelogHandle
from dstl_client.transport import WriterTransport

T = TypeVar("T")

#: room kept in every request for its fields besides the changes (log id, SQN,
#: session, seq): the changes of one request are at most ``max_message_bytes``
#: minus this, so gRPC never refuses a request the client built
REQUEST_MARGIN_BYTES = 64 << 10


class ChangelogWriter:
    """The log of one state backend instance. Thread-safe.

    Appends are buffered and sent in batches (``batch_bytes``); every other
    call sends the buffer first, so the sidecar sees changes in call order.
    Calls go through the :class:`~dstl_client.transport.WriterTransport` the
    client built for the writer: the client's ``Mux`` stream, shared by its
    writers (opened at the first call, see :mod:`dstl_client._stream`) unless the client's
    ``transport`` is ``"unary"`` (:mod:`dstl_client._unary`); the writer calls
    it under its lock. The rules below are the same for both: a request
    waiting on a stream that ends fails as a lost unary call does.
    Bad input (key group outside the range, a change over the limit) raises
    at ``append``, before anything is buffered.

    **A full memory budget is waited out.** A call that carries changes and
    that the sidecar refuses with :class:`~dstl_client.core.errors.BudgetFull`
    (its budget is full; nothing was applied) is sent again, unchanged and in
    its place in the call order, after a jittered pause that doubles up to
    1 s, for up to ``timeout_s``; the sidecar fails the writer with a plain
    ``Backpressure`` once it has pushed it back for ``backpressure_timeout_s``.
    The client's unary calls that carry changes hold at most 16 MiB in flight
    together, one call at a time while any is pushed back
    (:mod:`dstl_client._resend_gate`);
    on a Session stream the sidecar leaves a request unread while its budget
    cannot take it.

    **A failed send fails the writer, for good.** ``append()`` returns before
    its change is sent, so once a send of buffered changes fails (an
    ``Append`` refused with :class:`~dstl_client.core.errors.Backpressure`, a lost
    connection, a deadline; a persist that carried changes and failed with
    anything but :class:`~dstl_client.core.errors.UploadFailed`) the writer can no
    longer promise a complete log. The call whose send failed raises the
    original typed error (``Backpressure``, ``SidecarUnavailable``...; for a
    persist, through its future); every later call (``append``,
    ``append_many``, ``flush``, ``last_appended_sqn``, ``persist_durably``,
    ``truncate``) raises :class:`~dstl_client.core.errors.WriterFailed` with that
    error as ``cause``, and a persist already in flight whose handle could
    miss those changes fails with it too: no handle ever silently lacks a
    change whose ``append`` returned. A ``last_appended_sqn`` or ``truncate``
    whose outcome is unknown (unavailable, deadline, cancelled) fails the
    writer as well; a refusal of the sidecar (e.g. ``SqnOutOfRange``) and an
    ``UploadFailed`` (the sidecar keeps the changes, the next persist uploads
    them) do not. Recover by recreating the writer and restoring from the
    last checkpoint; ``close()`` still works on a failed writer.
    """

    def __init__(
        self,
        transport: WriterTransport,
        job_id: str,
        log_id: str,
        key_group_range: tuple[int, int],
        max_change_bytes: int,
        *,
        batch_bytes: int,
        max_message_bytes: int,
        packed: bool = True,
    ) -> None:
        #: how the calls reach the sidecar (built by the client: stream or unary)
        self.transport = transport
        self.job_id = job_id
        self.log_id = log_id
        self.key_group_range = key_group_range
        self.batch_bytes = batch_bytes
        # bytes of changes one request may carry, and the room left before an add
        capacity = max_message_bytes - REQUEST_MARGIN_BYTES
        self._room = capacity - PART_FRAMING_BYTES - 4
        #: largest single change accepted: the sidecar's limit, or what fits in a request
        self.max_change_bytes = min(max_change_bytes, self._room)
        #: ``packed``: the sidecar accepts a call's changes as one PackedParts
        self._buffer = ChangeBuffer(key_group_range, self.max_change_bytes, packed=packed)
        self._lock = threading.Lock()
        # numbers the calls that change the log (a failure's place in the call order)
        self._seq = 0
        self._closed = False
        self.last_sqn: int | None = None
        # the error that failed the writer and the seq of its call; set once,
        # also from gRPC callback threads, so under a lock of its own that is
        # never held across a call (a callback may run in the calling thread)
        self._failed: DstlError | None = None
        self._failed_seq = 0
        self._failed_lock = threading.Lock()
        # resolved once the outcome of the latest persist is settled: a persist's
        # handle is delivered only after every earlier persist's outcome is known
        self._last_persist: concurrent.futures.Future[None] | None = None

    @property
    def packed(self) -> bool:
        """Whether the writer sends a call's changes as one ``PackedParts`` (its sidecar
        said it accepts them; :meth:`ChangelogClient.open_writer` takes it back)."""
        return self._buffer.packed

    @property
    def failed(self) -> DstlError | None:
        """The error that failed the writer (see the class docs), or ``None``."""
        return self._failed

    def _fail(self, exc: BaseException, seq: int) -> None:
        """Fail the writer (the first failure wins)."""
        cause = exc if isinstance(exc, DstlError) else DstlError(f"{type(exc).__name__}: {exc}")
        with self._failed_lock:
            if self._failed is None:
                self._failed = cause
                self._failed_seq = seq

    def _writer_failed(self) -> WriterFailed:
        cause = self._failed
        assert cause is not None
        return WriterFailed(
            f"writer {self.log_id} failed earlier ({type(cause).__name__}: {cause.message}); "
            "changes may be lost: recreate the writer and recover from the last checkpoint",
            cause=cause,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosed(f"writer {self.log_id} is closed")
        if self._failed is not None:
            raise self._writer_failed()

    def append(self, key_group: int, data: bytes) -> None:
        """Buffer one change of ``key_group``; sent when the batch is full."""
        with self._lock:
            self._check_open()
            self._append_locked(key_group, data)

    def _append_locked(self, key_group: int, data: bytes) -> None:
        buf = self._buffer
        buf.check(key_group, len(data))
        if buf.count and buf.nbytes + buf.framing + len(data) > self._room:
            self._send_locked()  # the request would outgrow max_message_bytes
        buf.add(key_group, data)
        if buf.nbytes >= self.batch_bytes or buf.parts >= MAX_PARTS_PER_REQUEST:
            self._send_locked()

    def append_many(self, changes: Iterable[tuple[int, bytes]]) -> None:
        """Buffer many ``(key_group, data)`` changes under one lock acquisition: the same
        as ``append`` of each (on bad input, those before it stay buffered), sent at the
        same points. A chunk (:data:`_CHUNK`) of good ``(int, bytes)`` pairs is checked
        with C loops and added in runs between sends, any other change by change."""
        buf = self._buffer
        limit = self.batch_bytes
        room = self._room
        it = iter(changes)
        with self._lock:
            self._check_open()
            while chunk := list(islice(it, _CHUNK)):
                columns = buf.columns(chunk)
                start = 0
                while start < len(chunk):
                    taken = buf.add_run(columns, start, limit, room) if columns else 0
                    if taken:
                        start += taken
                        if buf.nbytes >= limit or buf.parts >= MAX_PARTS_PER_REQUEST:
                            self._send_locked()
                        continue
                    kg, data = chunk[start]
                    self._append_locked(kg, data)
                    start += 1

    def append_packed(self, key_group: int, sizes: array[int], payload: bytes) -> None:
        """Buffer a run of changes of one key group, packed: the same as ``append`` of each.

        ``sizes`` (an ``array("I")``) holds the changes' sizes in order and
        ``payload`` their bytes back to back (as ``KeyGroupChanges`` carries
        them), so a caller that encodes many changes at once (a snapshot
        upload) costs a few C-level operations per run instead of a call per
        change. The run is checked as a whole before anything is buffered
        (key group, each size against the limit, sizes adding up to the
        payload); a run too large for one request is split between changes.
        """
        count = len(sizes)
        if sizes.typecode != "I" or sum(sizes) != len(payload):
            raise InvalidArgument(
                f"sizes ({count} changes, {sum(sizes)} bytes) do not describe "
                f"a payload of {len(payload)} bytes"
            )
        buf = self._buffer
        with self._lock:
            self._check_open()
            if not count:
                buf.check(key_group, 0)
                return
            buf.check(key_group, max(sizes))
            if type(payload) is not bytes:  # kept by reference until sent
                payload = bytes(payload)
            limit = self.batch_bytes
            room = self._room
            start = 0
            offset = 0
            while start < count:
                # as in append: a change fits while nbytes + framing + its size <= room
                end, nbytes = fit_sizes(sizes, start, room + 4 - buf.nbytes - buf.framing)
                if end == start:  # not even one more change fits: send, then it does
                    if not buf.count:  # pragma: no cover - max_change_bytes <= room
                        raise ChangeTooLarge(f"a change does not fit in a request of {room}")
                    self._send_locked()
                    continue
                if start == 0 and end == count:
                    buf.add_packed(key_group, sizes, payload)
                else:
                    buf.add_packed(key_group, sizes[start:end], payload[offset : offset + nbytes])
                start = end
                offset += nbytes
                if buf.nbytes >= limit or buf.parts >= MAX_PARTS_PER_REQUEST or start < count:
                    self._send_locked()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send_locked(self) -> None:
        if not self._buffer.count:
            return
        seq = self._next_seq()
        try:
            sqn = self.transport.append(seq, self._buffer)
        except BaseException as exc:
            # append() returned for these changes; they may be lost: fail for good
            self._fail(exc, seq)
            raise
        self.last_sqn = sqn

    def _call_ordered(self, call: Callable[[int], T]) -> T:
        """A call without changes; one whose outcome is unknown fails the writer."""
        seq = self._next_seq()
        try:
            return call(seq)
        except BaseException as exc:
            if _outcome_unknown(exc):
                self._fail(exc, seq)
            raise

    def flush(self) -> None:
        """Send buffered appends now (they are still not durable)."""
        with self._lock:
            self._check_open()
            self._send_locked()

    def last_appended_sqn(self) -> int:
        """Close the current changeset; return the boundary SQN (see the proto)."""
        with self._lock:
            self._check_open()
            self._send_locked()
            return self._call_ordered(self.transport.last_appended_sqn)

    def persist_durably(self, after: int) -> concurrent.futures.Future[ChangelogHandle]:
        """Future of the handle of every change with SQN >= ``after``.

        The buffer is sent first; then the call runs in the background. Failures
        arrive through the future as :class:`~dstl_client.core.errors.DstlError`
        (see the class docs for those that fail the writer).
        """
        out: concurrent.futures.Future[ChangelogHandle] = concurrent.futures.Future()
        settled: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._check_open()
            seq = self._next_seq()
            # The buffered changes travel inside the persist call: one round
            # trip per checkpoint instead of two.
            changes = self._buffer.count > 0
            previous, self._last_persist = self._last_persist, settled
            try:
                call = self.transport.persist(seq, after, self._buffer)
            except BaseException as exc:  # e.g. the channel is closed
                if changes:
                    self._fail(exc, seq)
                settled.set_result(None)
                raise

        def deliver(outcome: ChangelogHandle | BaseException) -> None:
            try:
                with self._failed_lock:
                    # did an earlier call lose changes this handle would lack?
                    lost_before = self._failed is not None and self._failed_seq < seq
                if lost_before:  # whatever the sidecar answered
                    out.set_exception(self._writer_failed())
                elif isinstance(outcome, BaseException):
                    out.set_exception(outcome)
                else:
                    out.set_result(outcome)
            finally:
                settled.set_result(None)

        def done(f: concurrent.futures.Future[ChangelogHandle]) -> None:
            outcome: ChangelogHandle | BaseException
            try:
                outcome = f.result()
            except BaseException as exc:  # a typed refusal, a lost call, a bad handle...
                outcome = exc
            if isinstance(outcome, BaseException) and (
                (changes and not isinstance(outcome, UploadFailed))
                or isinstance(outcome, CallLost | WriterFailed)
            ):
                self._fail(outcome, seq)
            if previous is None or previous.done():
                deliver(outcome)
            else:
                previous.add_done_callback(lambda _: deliver(outcome))

        call.add_done_callback(done)
        return out

    def truncate(self, before: int) -> None:
        """Changes with SQN < ``before`` are no longer needed (materialized)."""
        with self._lock:
            self._check_open()
            self._send_locked()
            self._call_ordered(lambda seq: self.transport.truncate(seq, before))

    def close(self) -> None:
        """No more appends; buffered and unpersisted changes are dropped.

        Works on a failed writer too, best effort: it then raises nothing.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._buffer.drain()
            try:
                self.transport.close()
            except WriterFailed:
                pass
            except Exception:  # a DstlError, or the client's channel is closed
                if self._failed is None:
                    raise

    def __enter__(self) -> ChangelogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: changes :meth:`ChangelogWriter.append_many` reads from its iterable at a time
_CHUNK = 1024


def _outcome_unknown(exc: BaseException) -> bool:
    """Whether a failed call may or may not have been applied (or left its session broken)."""
    if not isinstance(exc, DstlError):
        return True  # interrupted in the middle of the call
    if type(exc) is DstlError:  # untyped: an internal error, an unknown status
        return True
    return isinstance(exc, SidecarUnavailable | ShuttingDown | CallLost | WriterFailed)
