"""The blob store interface every storage backend implements.

Contract (checked by ``tests/dstl_server/storage/contract.py`` for every store):

* ``put`` is atomic: a reader sees either no object or the whole object, never
  a prefix, also after a crash. ``put`` of an existing key replaces it
  atomically (the sidecar never reuses keys; every attempt gets a new one).
* ``get`` with ``offset``/``length`` returns exactly that byte range; a range
  past the end returns the bytes that exist (possibly fewer); a missing key
  raises :class:`BlobNotFound`.
* ``delete`` of missing keys is not an error; it returns how many existed
  where the store can tell (otherwise how many it was asked to delete).
* ``list`` yields every key under a prefix with its size and modification
  time (unix seconds: a file's mtime, S3's LastModified), in key order. A
  prefix is a string prefix; a "directory" is not an object (``get`` of it
  raises :class:`BlobNotFound`). With ``start_after`` only keys greater than
  it (string order) are yielded, so a caller pages through a large listing
  without the store listing the earlier keys again (S3's ``StartAfter``).
  Callers pass a key listed before: some S3-compatible servers (SeaweedFS)
  skip the keys of a "directory" whose name is passed.
* Keys are checked with :func:`validate_key`; a bad key raises
  :class:`~dstl_client.core.errors.InvalidArgument` from ``put``, ``get`` and ``delete``.
* Errors are :class:`StorageError` subclasses; ``retryable`` says whether the
  same call may succeed when tried again.
* ``probe`` returns when the store answers (a cheap round trip that also
  proves writes can work where the store can tell) and raises a
  :class:`StorageError` when it does not; it never creates, changes or
  removes an object (whatever it writes is never listed).
* ``fatal_at_start(error)`` says whether a probe failing with ``error`` when
  the sidecar starts means the configuration cannot work (it exits 2): by
  default an error that is not ``retryable`` (a missing bucket, refused
  credentials); an unreachable store is not fatal (health NOT_SERVING).
* ``sweep_leftovers(older_than_s)`` removes what interrupted writes left
  behind (temp files of a ``put`` whose process died) that is older than
  ``older_than_s`` seconds, and returns how many it removed. Objects are
  never touched. With an age bound at least the upload deadline, a write in
  progress is never touched either; ``0`` removes every leftover, for use
  when the store is opened (the sidecar owns its store, so at start every
  leftover belongs to an earlier process). Stores whose writes leave nothing
  behind return 0.

Stores are used from the sidecar's event loop; implementations must not block
it (file I/O goes to threads).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from dstl_client.core.errors import InvalidArgument, StorageError


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """A listed object: its key, size in bytes and last modification time.

    ``modified`` is in seconds since the Unix epoch (a file's mtime, S3's
    ``LastModified``); every real store sets it. ``0.0`` means unknown (test
    fakes): callers deciding by age must treat it as "maybe just written".
    """

    key: str
    size: int
    modified: float = 0.0


class BlobStore(abc.ABC):
    """Async object storage: atomic puts, ranged gets, deletes, listing."""

    #: URL the store was opened from, with credentials removed (for logs)
    url: str = ""

    @abc.abstractmethod
    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically and durably."""

    @abc.abstractmethod
    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes from ``offset`` (to the end when ``length`` is None)."""

    @abc.abstractmethod
    async def delete(self, keys: Sequence[str]) -> int:
        """Delete keys; missing ones are ignored."""

    @abc.abstractmethod
    def list(self, prefix: str = "", start_after: str = "") -> AsyncIterator[BlobInfo]:
        """Yield the objects whose key starts with ``prefix``, in key order.

        With ``start_after``, only those whose key is greater than it.
        """

    async def probe(self) -> None:  # noqa: B027 - optional hook
        """Return when the store answers; raise :class:`StorageError` when it does not.

        The default suits stores that cannot be unreachable (in-memory fakes).
        """

    def fatal_at_start(self, error: StorageError) -> bool:
        """Whether a failed probe when the sidecar starts means it cannot work at all.

        Then the sidecar exits (code 2) instead of serving NOT_SERVING until
        the store answers. By default the errors that trying again cannot fix
        (a missing bucket, refused credentials: not ``retryable``) are fatal
        and an unreachable store is not.
        """
        return not error.retryable

    async def sweep_leftovers(self, older_than_s: float) -> int:
        """Remove leftovers of interrupted writes older than ``older_than_s`` seconds.

        Returns how many were removed. The default suits stores whose writes
        are atomic on the server and leave nothing behind.
        """
        return 0

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    async def __aenter__(self) -> BlobStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def validate_key(key: str) -> None:
    """Keys are relative, '/'-separated, without empty, '.' or '..' parts."""
    if not key or key.startswith("/") or len(key) > 1024:
        raise InvalidArgument(f"bad object key {key!r}")
    for part in key.split("/"):
        if part in ("", ".", "..") or "\\" in part or "\x00" in part:
            raise InvalidArgument(f"bad object key {key!r}")
