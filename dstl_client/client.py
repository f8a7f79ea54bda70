"""The synchronous, thread-safe client used from PySpark Python workers.

::

    with ChangelogClient("127.0.0.1:7070") as client:        # or "unix:///path"
        w = client.create_writer(job_id="j", operator_id="op", key_group_range=(0, 127))
        w.append(key_group=5, data=b"...")                    # buffered, sent in batches
        sqn = w.last_appended_sqn()
        handle = w.persist_durably(after=0).result(timeout=10)
        for key_group, sqn, data in client.read_changes(handle, key_groups=[5]): ...
        w.truncate(before=sqn)
        w.close()
"""

from __future__ import annotations

import concurrent.futures
import secrets
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import grpc

from dstl_client._buffer import PART_FRAMING_BYTES, ChangeBuffer
from dstl_client._status import channel_options, credentials_and_metadata, to_dstl_error
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import (
    CallLost,
    ConfigError,
    DstlError,
    ShuttingDown,
    SidecarUnavailable,
    UploadFailed,
    WriterClosed,
    WriterFailed,
)
from dstl_client.core.format import MAX_PARTS_PER_REQUEST, ChangesetView, split_changes
from dstl_client.core.handle import ChangelogHandle

#: appends are sent once this many bytes are buffered per writer
DEFAULT_BATCH_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
#: room kept in every request for its fields besides the changes (log id, SQN,
#: session, seq): the changes of one request are at most ``max_message_bytes``
#: minus this, so gRPC never refuses a request the client built
REQUEST_MARGIN_BYTES = 64 << 10


class ChangelogClient:
    """A connection to one sidecar. Thread-safe; share one per process.

    ``target`` is ``host:port`` or ``unix:///path``. ``token`` is sent as a
    bearer token when the sidecar requires one; ``root_certificates`` (PEM)
    turns on TLS. ``timeout_s`` bounds every call but ``persist_durably``,
    whose future the caller waits on with its own timeout.

    ``max_message_bytes`` is the largest gRPC message sent or received; no
    request the client builds exceeds it (a writer sends its buffer early
    rather than let a request grow past it), and ``batch_bytes`` must leave
    ``REQUEST_MARGIN_BYTES`` below it. The sidecar's ``max_request_bytes``
    should not be smaller.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if batch_bytes < 1 or batch_bytes > max_message_bytes - REQUEST_MARGIN_BYTES:
            raise ConfigError(
                f"batch_bytes={batch_bytes} must be between 1 and max_message_bytes "
                f"({max_message_bytes}) minus {REQUEST_MARGIN_BYTES} bytes of request overhead "
                f"(at most {max_message_bytes - REQUEST_MARGIN_BYTES}): a larger batch would "
                "be refused by gRPC before the sidecar sees it"
            )
        self.target = target
        self.timeout_s = timeout_s
        self.batch_bytes = batch_bytes
        self.max_message_bytes = max_message_bytes
        creds, self._metadata = credentials_and_metadata(token, root_certificates)
        options = channel_options(max_message_bytes)
        if creds is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, creds, options=options)
        self._stub = pb_grpc.ChangelogStub(self._channel)  # type: ignore[no-untyped-call]
        self.server_epoch: str | None = None

    # ------------------------------------------------------------------ calls
    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise to_dstl_error(exc) from None

    def create_writer(
        self, *, job_id: str, operator_id: str, key_group_range: tuple[int, int]
    ) -> ChangelogWriter:
        """Register a writer for one subtask's key-group range (inclusive)."""
        first, last = key_group_range
        resp = self._call(
            self._stub.CreateWriter,
            pb.CreateWriterRequest(
                job_id=job_id, operator_id=operator_id, first_key_group=first, last_key_group=last
            ),
        )
        self.server_epoch = resp.server_epoch
        return ChangelogWriter(self, job_id, resp.log_id, (first, last), resp.max_change_bytes)

    def read_changesets(
        self, handle: ChangelogHandle, key_groups: Iterable[int] | None = None
    ) -> Iterator[ChangesetView]:
        """Changesets of the handle (packed), per key group in SQN order."""
        req = pb.ReadChangesRequest(handle=handle.to_proto(), key_groups=list(key_groups or ()))
        try:
            for msg in self._stub.ReadChanges(req, timeout=self.timeout_s, metadata=self._metadata):
                yield ChangesetView(msg.key_group, msg.sqn, msg.count, msg.sizes, msg.payload)
        except grpc.RpcError as exc:
            raise to_dstl_error(exc) from None

    def read_changes(
        self, handle: ChangelogHandle, key_groups: Iterable[int] | None = None
    ) -> Iterator[tuple[int, int, bytes]]:
        """``(key_group, sqn, data)`` for every change of the handle in those key groups."""
        for view in self.read_changesets(handle, key_groups):
            for data in split_changes(view.count, view.sizes, view.payload):
                yield view.key_group, view.sqn, data

    def discard_objects(self, job_id: str, object_keys: Sequence[str]) -> int:
        """Delete objects of ``job_id`` that no retained checkpoint refers to."""
        resp = self._call(
            self._stub.DiscardObjects,
            pb.DiscardObjectsRequest(job_id=job_id, object_keys=list(object_keys)),
        )
        return int(resp.deleted)

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Block until the channel connects (raises SidecarUnavailable)."""
        from dstl_client.core.errors import SidecarUnavailable

        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise SidecarUnavailable(
                f"no sidecar answered at {self.target} in {timeout_s}s"
            ) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ChangelogClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChangelogWriter:
    """The log of one state backend instance. Thread-safe.

    Appends are buffered and sent in batches (``batch_bytes``); every other
    call sends the buffer first, so the sidecar sees changes in call order.
    Bad input (key group outside the range, a change over the limit) raises
    at ``append``, before anything is buffered.

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
        client: ChangelogClient,
        job_id: str,
        log_id: str,
        key_group_range: tuple[int, int],
        max_change_bytes: int,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.log_id = log_id
        self.key_group_range = key_group_range
        # bytes of changes one request may carry, and the room left before an add
        capacity = client.max_message_bytes - REQUEST_MARGIN_BYTES
        self._room = capacity - PART_FRAMING_BYTES - 4
        #: largest single change accepted: the sidecar's limit, or what fits in a request
        self.max_change_bytes = min(max_change_bytes, self._room)
        self._buffer = ChangeBuffer(key_group_range, self.max_change_bytes)
        self._lock = threading.Lock()
        # numbers the calls that change the log, within a random session (see the proto)
        self._session = secrets.randbits(63) | 1
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
            buf = self._buffer
            buf.check(key_group, len(data))
            if buf.count and buf.nbytes + buf.framing + len(data) > self._room:
                self._send_locked()  # the request would outgrow max_message_bytes
            buf.add(key_group, data)
            if buf.nbytes >= self.client.batch_bytes or buf.parts >= MAX_PARTS_PER_REQUEST:
                self._send_locked()

    def append_many(self, changes: Iterable[tuple[int, bytes]]) -> None:
        """Buffer many ``(key_group, data)`` changes under one lock acquisition.

        Changes are checked one by one: on bad input, those before it stay buffered.
        """
        buf = self._buffer
        limit = self.client.batch_bytes
        room = self._room
        with self._lock:
            self._check_open()
            for kg, data in changes:
                buf.check(kg, len(data))
                if buf.nbytes + buf.framing + len(data) > room and buf.count:
                    self._send_locked()  # the request would outgrow max_message_bytes
                buf.add(kg, data)
                if buf.nbytes >= limit or buf.parts >= MAX_PARTS_PER_REQUEST:
                    self._send_locked()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send_locked(self) -> None:
        if not self._buffer.count:
            return
        seq = self._next_seq()
        try:
            resp = self.client._call(
                self.client._stub.Append,
                pb.AppendRequest(
                    log_id=self.log_id,
                    changes=self._buffer.drain(),
                    session=self._session,
                    seq=seq,
                ),
            )
        except BaseException as exc:
            # append() returned for these changes; they may be lost: fail for good
            self._fail(exc, seq)
            raise
        self.last_sqn = int(resp.sqn)

    def _call_ordered(self, method: Any, request: Any) -> Any:
        """A call without changes; one whose outcome is unknown fails the writer."""
        try:
            return self.client._call(method, request)
        except BaseException as exc:
            if _outcome_unknown(exc):
                self._fail(exc, request.seq)
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
            resp = self._call_ordered(
                self.client._stub.LastAppendedSqn,
                pb.LastAppendedSqnRequest(
                    log_id=self.log_id, session=self._session, seq=self._next_seq()
                ),
            )
            return int(resp.sqn)

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
            # The buffered changes travel inside the persist call: one round
            # trip per checkpoint instead of two.
            changes = self._buffer.drain() if self._buffer.count else []
            seq = self._next_seq()
            previous, self._last_persist = self._last_persist, settled
            try:
                call = self.client._stub.PersistDurably.future(
                    pb.PersistRequest(
                        log_id=self.log_id,
                        after=after,
                        changes=changes,
                        session=self._session,
                        seq=seq,
                    ),
                    metadata=self.client._metadata,
                )
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

        def done(f: Any) -> None:
            outcome: ChangelogHandle | BaseException
            try:
                outcome = ChangelogHandle.from_proto(f.result().handle)
            except grpc.RpcError as exc:
                outcome = to_dstl_error(exc)
            except BaseException as exc:  # grpc.FutureCancelledError, a bad handle...
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
            self._call_ordered(
                self.client._stub.Truncate,
                pb.TruncateRequest(
                    log_id=self.log_id, before=before, session=self._session, seq=self._next_seq()
                ),
            )

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
                self.client._call(
                    self.client._stub.CloseWriter, pb.CloseWriterRequest(log_id=self.log_id)
                )
            except WriterFailed:
                pass
            except Exception:  # a DstlError, or the client's channel is closed
                if self._failed is None:
                    raise

    def __enter__(self) -> ChangelogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _outcome_unknown(exc: BaseException) -> bool:
    """Whether a failed call may or may not have been applied (or left its session broken)."""
    if not isinstance(exc, DstlError):
        return True  # interrupted in the middle of the call
    if type(exc) is DstlError:  # untyped: an internal error, an unknown status
        return True
    return isinstance(exc, SidecarUnavailable | ShuttingDown | CallLost | WriterFailed)
