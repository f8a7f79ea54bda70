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

from collections.abc import Iterable, Iterator, Sequence

from dstl_client._resend_gate import ResendGate
from dstl_client._stream import MuxStream, StreamTransport
from dstl_client._unary import UnaryTransport
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.core.format import ChangesetView, split_changes
from dstl_client.core.handle import ChangelogHandle
from dstl_client.objects import ObjectInfo
from dstl_client.transport import Connection, WriterTransport
from dstl_client.writer import REQUEST_MARGIN_BYTES, ChangelogWriter

__all__ = ["REQUEST_MARGIN_BYTES", "ChangelogClient", "ChangelogWriter"]

#: appends are sent once this many bytes are buffered per writer
DEFAULT_BATCH_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
#: how writers send their calls: "stream" (one Mux stream per client) or "unary"
TRANSPORTS = ("stream", "unary")


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

    ``transport`` is how writers send ``append``, ``last_appended_sqn``,
    ``persist_durably`` and ``truncate``: ``"stream"`` (the default) on one
    long-lived ``Mux`` stream per client that carries every writer's calls,
    opened at the first call (requests ready together leave in one message:
    a fraction of a unary call's cost on the sidecar), or ``"unary"``, one RPC
    per call; then the calls that carry changes hold at most 16 MiB in
    flight per client (one request at least; one at a time while the
    sidecar's memory budget pushes them back), since the sidecar holds a
    unary request in memory before it can refuse it.
    The public API and its guarantees are the same either way.
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
        transport: str = "stream",
    ) -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport={transport!r}: must be one of {', '.join(TRANSPORTS)}")
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
        self.transport = transport
        self._conn = Connection(
            target,
            token=token,
            root_certificates=root_certificates,
            timeout_s=timeout_s,
            max_message_bytes=max_message_bytes,
        )
        self.server_epoch: str | None = None
        #: its writers' unary calls that carry changes: a bounded window, one at a time
        #: while any is pushed back by a full memory budget (see dstl_client._resend_gate)
        self._resend_gate = ResendGate()
        #: every writer's calls on one stream (transport "stream"), opened at the first
        self._stream = MuxStream(self._conn)

    # ------------------------------------------------------------------ calls
    def _writer_transport(self, log_id: str) -> WriterTransport:
        """How a new writer's calls reach the sidecar (the ``transport`` setting)."""
        if self.transport == "unary":
            return UnaryTransport(self._conn, log_id, self._resend_gate)
        return StreamTransport(self._conn, log_id, self._stream)

    def create_writer(
        self, *, job_id: str, operator_id: str, key_group_range: tuple[int, int]
    ) -> ChangelogWriter:
        """Register a writer for one subtask's key-group range (inclusive)."""
        first, last = key_group_range
        resp = self._conn.call(
            self._conn.stub.CreateWriter,
            pb.CreateWriterRequest(
                job_id=job_id, operator_id=operator_id, first_key_group=first, last_key_group=last
            ),
        )
        self.server_epoch = resp.server_epoch
        return self.open_writer(
            job_id=job_id,
            log_id=resp.log_id,
            key_group_range=(first, last),
            max_change_bytes=resp.max_change_bytes,
            packed=resp.accepts_packed,
        )

    def open_writer(
        self,
        *,
        job_id: str,
        log_id: str,
        key_group_range: tuple[int, int],
        max_change_bytes: int,
        packed: bool = True,
    ) -> ChangelogWriter:
        """A writer for a log the sidecar already has (by its log id); makes no call.

        ``max_change_bytes`` is the sidecar's limit as :meth:`create_writer`
        got it (the writer refuses larger changes before sending them);
        ``packed`` whether that sidecar accepted packed changes (``writer.packed``
        of the writer :meth:`create_writer` returned: every sidecar of this
        release does, an older one answers a packed call with "empty append batch").
        """
        return ChangelogWriter(
            self._writer_transport(log_id),
            job_id,
            log_id,
            key_group_range,
            max_change_bytes,
            batch_bytes=self.batch_bytes,
            max_message_bytes=self.max_message_bytes,
            packed=packed,
        )

    def read_changesets(
        self, handle: ChangelogHandle, key_groups: Iterable[int] | None = None
    ) -> Iterator[ChangesetView]:
        """Changesets of the handle (packed), per key group in SQN order.

        Asks for batched messages (several changesets each); a sidecar that
        predates them sends one per message, which reads the same.
        """
        req = pb.ReadChangesRequest(
            handle=handle.to_proto(),
            key_groups=list(key_groups or ()),
            batched=True,
            max_message_bytes=min(self.max_message_bytes, 0xFFFF_FFFF),
        )
        for msg in self._conn.read_stream(self._conn.stub.ReadChanges, req):
            if msg.changesets:
                for cs in msg.changesets:
                    yield ChangesetView(cs.key_group, cs.sqn, cs.count, cs.sizes, cs.payload)
            else:
                yield ChangesetView(msg.key_group, msg.sqn, msg.count, msg.sizes, msg.payload)

    def read_changes(
        self, handle: ChangelogHandle, key_groups: Iterable[int] | None = None
    ) -> Iterator[tuple[int, int, bytes]]:
        """``(key_group, sqn, data)`` for every change of the handle in those key groups."""
        for view in self.read_changesets(handle, key_groups):
            for data in split_changes(view.count, view.sizes, view.payload):
                yield view.key_group, view.sqn, data

    def discard_objects(self, job_id: str, object_keys: Sequence[str]) -> int:
        """Delete objects of ``job_id`` that no retained checkpoint refers to."""
        resp = self._conn.call(
            self._conn.stub.DiscardObjects,
            pb.DiscardObjectsRequest(job_id=job_id, object_keys=list(object_keys)),
        )
        return int(resp.deleted)

    def list_objects(self, job_id: str, *, page_size: int = 1000) -> Iterator[ObjectInfo]:
        """Every object of ``job_id`` in key order, fetched lazily a page at a time.

        The sidecar lists its blob store (the caller needs no storage access)
        and examines at most ``page_size`` keys per call (it caps that at
        1000). A job token lists only its own job (else PermissionDenied).
        Objects written or deleted while the listing runs may or may not
        appear.
        """
        if page_size < 1:
            raise InvalidArgument(f"page_size={page_size}: must be >= 1")
        token = ""
        while True:
            resp = self._conn.call(
                self._conn.stub.ListObjects,
                pb.ListObjectsRequest(
                    job_id=job_id, page_size=min(page_size, 0xFFFFFFFF), page_token=token
                ),
            )
            for obj in resp.objects:
                yield ObjectInfo(obj.object_key, int(obj.size), obj.modified_unix_ms / 1000.0)
            token = resp.next_page_token
            if not token:
                return

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Block until the channel connects (raises SidecarUnavailable)."""
        self._conn.wait_ready(timeout_s)

    def close(self) -> None:
        self._stream.close()
        self._conn.close()

    def __enter__(self) -> ChangelogClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
