"""What a job's metadata store promises: the interface, its errors, valid names.

:class:`MetadataStore` is implemented by
:class:`~dstl_client.coordinator.metadata_file.FileMetadataStore` (a POSIX
directory) and :class:`~dstl_client.coordinator.metadata_s3.S3MetadataStore`
(a bucket); :func:`dstl_client.coordinator.metadata.open_metadata_store`
picks one by URL.
"""

from __future__ import annotations

import abc
import builtins

from dstl_client.checkpoint.codec import CorruptMetadata
from dstl_client.core.errors import DstlError

__all__ = [
    "CorruptMetadata",
    "MetadataStore",
    "MetadataStoreError",
    "MetadataWriteConflict",
    "check_name",
    "check_prefix",
]


class MetadataStoreError(DstlError):
    """A metadata store operation failed (I/O, S3 error, credentials); names the URL."""

    grpc_code = "UNAVAILABLE"
    kind = "metadata_store"

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        #: throttling, 5xx, timeouts, lost connections: another attempt may succeed
        self.retryable = retryable


class MetadataWriteConflict(MetadataStoreError):
    """S3 kept answering 409 ``ConditionalRequestConflict`` to a write-once (concurrent writers)."""

    grpc_code = "ABORTED"
    kind = "metadata_write_conflict"


def check_name(name: str) -> str:
    """``name`` if it is a valid object name: relative, ``/``-separated, no hidden parts.

    Components must be non-empty and must not start with ``.`` (no ``..``,
    and no clash with the file store's hidden temp files).
    """
    parts = name.split("/")
    if not name or any(not p or p.startswith(".") for p in parts) or "\0" in name:
        raise ValueError(f"bad metadata object name {name!r}")
    return name


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a valid listing prefix: ``""`` or a (partial) relative name."""
    if prefix.startswith("/") or "\0" in prefix or any(p in (".", "..") for p in prefix.split("/")):
        raise ValueError(f"bad metadata listing prefix {prefix!r}")
    return prefix


class MetadataStore(abc.ABC):
    """Small objects of one job's driver under names relative to a root URL.

    Invariants:

    * :meth:`put_once` never overwrites: of any number of concurrent calls
      for one name (threads, processes, drivers on other machines) exactly
      one returns True; the others, and every later call, return False and
      leave the stored bytes as they were.
    * A reader (:meth:`get`) sees no object or a complete one, never a torn
      or partial write, for :meth:`put_once` and :meth:`put` alike; :meth:`put`
      replaces an object atomically.
    * :meth:`list` returns every name under the prefix (no page limit),
      sorted, and never a temp file of a write in progress or interrupted.
    * :meth:`delete` of a missing name succeeds.
    * Failures raise :class:`MetadataStoreError` (a message naming the URL);
      a malformed name raises :class:`ValueError`.

    Thread-safety: every method may be called from any thread, concurrently;
    an implementation holds no mutable state but its client. :meth:`close`
    releases the client (after it no call may be made).
    """

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The root, as a URL (``file:///...`` or ``s3://bucket/prefix``)."""

    @property
    def retries(self) -> int:
        """Attempts this store repeated after a transient failure, so far (exported as
        ``dstl_driver_metadata_retries_total``); 0 for a store that never retries."""
        return 0

    @abc.abstractmethod
    def put_once(self, name: str, data: bytes) -> bool:
        """Create ``name`` with ``data`` unless it exists; False (nothing written) if it does."""

    @abc.abstractmethod
    def put(self, name: str, data: bytes) -> None:
        """Create or atomically replace ``name``."""

    @abc.abstractmethod
    def get(self, name: str) -> bytes | None:
        """The bytes of ``name``; ``None`` when it does not exist."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> builtins.list[str]:
        """Every name starting with ``prefix`` (a string prefix, e.g. ``"checkpoints/"``), sorted."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove ``name``; a missing name is fine."""

    def describe(self, name: str) -> str:
        """Where ``name`` lives, for messages."""
        return f"{self.url.rstrip('/')}/{name}"

    def remove_temp_files(self, prefix: str = "") -> int:
        """Remove what interrupted writes under ``prefix`` left behind; how many.

        Only stores whose writes go through temp files have any (the file
        store); an S3 PUT leaves nothing when it fails. Call it when no write
        under ``prefix`` is in flight (the file store's temp files are the
        in-flight writes too).
        """
        return 0

    def close(self) -> None:  # noqa: B027 - optional: only stores with a client override it
        """Release the client's resources (connections)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
