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

from dstl_client._buffer import ChangeBuffer
from dstl_client._pb import dstl_pb2 as pb
from dstl_client._pb import dstl_pb2_grpc as pb_grpc
from dstl_client._status import channel_options, credentials_and_metadata, to_dstl_error
from dstl_client.errors import DstlError, WriterClosed
from dstl_client.format import ChangesetView, split_changes
from dstl_client.handle import ChangelogHandle

#: appends are sent once this many bytes are buffered per writer
DEFAULT_BATCH_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 60.0


class ChangelogClient:
    """A connection to one sidecar. Thread-safe; share one per process.

    ``target`` is ``host:port`` or ``unix:///path``. ``token`` is sent as a
    bearer token when the sidecar requires one; ``root_certificates`` (PEM)
    turns on TLS. ``timeout_s`` bounds every call but ``persist_durably``,
    whose future the caller waits on with its own timeout.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.batch_bytes = batch_bytes
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
        from dstl_client.errors import SidecarUnavailable

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
        #: largest single change the sidecar accepts
        self.max_change_bytes = max_change_bytes
        self._buffer = ChangeBuffer(key_group_range, max_change_bytes)
        self._lock = threading.Lock()
        # numbers the calls that change the log, within a random session (see the proto)
        self._session = secrets.randbits(63) | 1
        self._seq = 0
        self._closed = False
        self.last_sqn: int | None = None

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosed(f"writer {self.log_id} is closed")

    def append(self, key_group: int, data: bytes) -> None:
        """Buffer one change of ``key_group``; sent when the batch is full."""
        self._buffer.check(key_group, len(data))
        with self._lock:
            self._check_open()
            self._buffer.add(key_group, data)
            if self._buffer.nbytes >= self.client.batch_bytes:
                self._send_locked()

    def append_many(self, changes: Iterable[tuple[int, bytes]]) -> None:
        """Buffer many ``(key_group, data)`` changes under one lock acquisition."""
        buf = self._buffer
        limit = self.client.batch_bytes
        with self._lock:
            self._check_open()
            for kg, data in changes:
                buf.check(kg, len(data))
                buf.add(kg, data)
                if buf.nbytes >= limit:
                    self._send_locked()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send_locked(self) -> None:
        if not self._buffer.count:
            return
        resp = self.client._call(
            self.client._stub.Append,
            pb.AppendRequest(
                log_id=self.log_id,
                changes=self._buffer.drain(),
                session=self._session,
                seq=self._next_seq(),
            ),
        )
        self.last_sqn = int(resp.sqn)

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
            resp = self.client._call(
                self.client._stub.LastAppendedSqn,
                pb.LastAppendedSqnRequest(
                    log_id=self.log_id, session=self._session, seq=self._next_seq()
                ),
            )
            return int(resp.sqn)

    def persist_durably(self, after: int) -> concurrent.futures.Future[ChangelogHandle]:
        """Future of the handle of every change with SQN >= ``after``.

        The buffer is sent first; then the call runs in the background. Failures
        arrive through the future as :class:`~dstl_client.errors.DstlError`.
        """
        out: concurrent.futures.Future[ChangelogHandle] = concurrent.futures.Future()
        with self._lock:
            self._check_open()
            # The buffered changes travel inside the persist call: one round
            # trip per checkpoint instead of two.
            changes = self._buffer.drain() if self._buffer.count else []
            call = self.client._stub.PersistDurably.future(
                pb.PersistRequest(
                    log_id=self.log_id,
                    after=after,
                    changes=changes,
                    session=self._session,
                    seq=self._next_seq(),
                ),
                metadata=self.client._metadata,
            )

        def done(f: Any) -> None:
            try:
                resp = f.result()
                out.set_result(ChangelogHandle.from_proto(resp.handle))
            except grpc.RpcError as exc:
                out.set_exception(to_dstl_error(exc))
            except DstlError as exc:
                out.set_exception(exc)
            except BaseException as exc:  # grpc.FutureCancelledError and friends
                out.set_exception(exc)

        call.add_done_callback(done)
        return out

    def truncate(self, before: int) -> None:
        """Changes with SQN < ``before`` are no longer needed (materialized)."""
        with self._lock:
            self._check_open()
            self._send_locked()
            self.client._call(
                self.client._stub.Truncate,
                pb.TruncateRequest(
                    log_id=self.log_id, before=before, session=self._session, seq=self._next_seq()
                ),
            )

    def close(self) -> None:
        """No more appends; buffered and unpersisted changes are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._buffer.drain()
            self.client._call(
                self.client._stub.CloseWriter, pb.CloseWriterRequest(log_id=self.log_id)
            )

    def __enter__(self) -> ChangelogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
