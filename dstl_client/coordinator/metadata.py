"""The driver's job metadata (checkpoint records, configuration overrides), addressed by URL.

A :class:`MetadataStore` holds small objects under *names* relative to its
root (``checkpoints/ck-000000000042.json``, ``config-overrides.json``; the
layout is :class:`~dstl_client.coordinator.config.CoordinatorConfig`'s).
:func:`open_metadata_store` maps a URL onto an implementation:

* a path (absolute, or relative to the working directory) or
  ``file:///absolute/path``: :class:`FileMetadataStore`, a POSIX directory
  (local or shared). Write-once is a hard link of a complete, fsynced temp
  file (:func:`dstl_client.core.atomic.write_once`): ``link`` fails when the
  name exists. Temp files are hidden (``.<name>.<random>.tmp-dstl``), never
  listed, and removed by :meth:`MetadataStore.remove_temp_files`.
* ``s3://bucket[/prefix]``: :class:`S3MetadataStore`, objects at
  ``<prefix>/<name>``. Write-once is a conditional PUT (``If-None-Match: *``):
  S3 answers 412 when the key exists, and a PUT is atomic (a reader sees no
  object or the whole one). Endpoint, region and credentials come from
  boto3's default chain (``AWS_*`` variables, ``AWS_ENDPOINT_URL``, profiles,
  IRSA / web identity, instance metadata), optionally overridden by
  ``s3_endpoint_url`` / ``s3_region``.

Anything else (``s3a://`` and ``s3n://``, Hadoop's schemes for the same
buckets; ``gs://``, ``hdfs://``, ``file://relative``, an empty URL) is a
:class:`~dstl_client.core.errors.ConfigError` naming the supported forms,
raised while a query is set up.

Why boto3 (sync) rather than pyarrow.fs or fsspec: it is already installed
(aioboto3 pulls it in, the sidecar uses the same botocore), it exposes S3's
conditional PUT parameter ``IfNoneMatch`` that write-once needs (the generic
file-system layers offer no create-only write on S3), and the driver's
metadata traffic is a few small objects per micro-batch, made from plain
threads: no event loop, no connection pool worth tuning.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dstl_client.checkpoint.codec import CorruptMetadata
from dstl_client.core.atomic import fsync_dir, is_temp_name, write_once, write_replace
from dstl_client.core.errors import ConfigError, DstlError

__all__ = [
    "CorruptMetadata",
    "FileMetadataStore",
    "MetadataStore",
    "MetadataStoreError",
    "MetadataWriteConflict",
    "S3MetadataStore",
    "check_name",
    "check_prefix",
    "open_metadata_store",
]

T = TypeVar("T")

SUPPORTED = "a path, file:///absolute/path or s3://bucket[/prefix]"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


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


# ------------------------------------------------------------------ POSIX


class FileMetadataStore(MetadataStore):
    """Files under a directory of a local or shared POSIX file system.

    ``put_once``: :func:`~dstl_client.core.atomic.write_once` (temp file,
    fsync, hard link: ``link`` fails when the name exists); ``put``:
    :func:`~dstl_client.core.atomic.write_replace` (temp file, fsync,
    rename). Directories are fsynced after a link, rename or unlink unless
    ``fsync=False`` (tests). Stateless apart from its root: any thread.
    """

    def __init__(self, root: str | Path, *, fsync: bool = True) -> None:
        self.root = Path(root).absolute()
        self._fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MetadataStoreError(f"cannot create the job metadata directory: {exc}") from None

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def path_of(self, name: str) -> Path:
        return self.root / check_name(name)

    def describe(self, name: str) -> str:
        return str(self.path_of(name))

    def put_once(self, name: str, data: bytes) -> bool:
        path = self.path_of(name)
        try:
            return write_once(path, data, fsync=self._fsync)
        except OSError as exc:
            raise MetadataStoreError(f"cannot write {path}: {exc}") from None

    def put(self, name: str, data: bytes) -> None:
        path = self.path_of(name)
        try:
            write_replace(path, data, fsync=self._fsync)
        except OSError as exc:
            raise MetadataStoreError(f"cannot write {path}: {exc}") from None

    def get(self, name: str) -> bytes | None:
        path = self.path_of(name)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise MetadataStoreError(f"cannot read {path}: {exc}") from None

    def _walk(self, prefix: str) -> builtins.list[tuple[Path, str, str]]:
        """``(directory, file name, name)`` of every file in the folder of ``prefix``, recursively.

        The folder is the prefix up to its last ``/``; hidden folders are
        skipped (names have none), hidden files are returned (temp files).
        """
        check_prefix(prefix)
        folder = prefix.rpartition("/")[0]
        base = self.root / folder if folder else self.root
        if not base.is_dir():
            return []
        out: builtins.list[tuple[Path, str, str]] = []
        try:
            for dirpath, dirnames, filenames in os.walk(base, onerror=_raise_unless_gone):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                here = Path(dirpath)
                rel = here.relative_to(self.root).as_posix()
                out.extend((here, f, f if rel == "." else f"{rel}/{f}") for f in filenames)
        except OSError as exc:
            raise MetadataStoreError(f"cannot list {base}: {exc}") from None
        return out

    def list(self, prefix: str = "") -> builtins.list[str]:
        return sorted(
            name
            for _, f, name in self._walk(prefix)
            if not f.startswith(".") and name.startswith(prefix)
        )

    def delete(self, name: str) -> None:
        path = self.path_of(name)
        try:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(path)
            if self._fsync and path.parent.is_dir():
                fsync_dir(path.parent)
        except OSError as exc:
            raise MetadataStoreError(f"cannot delete {path}: {exc}") from None

    def remove_temp_files(self, prefix: str = "") -> int:
        """Temp files (and ``.tmp-*`` of older versions) in the folder of ``prefix``, recursively."""
        n = 0
        for here, f, _ in self._walk(prefix):
            if is_temp_name(f) or f.startswith(".tmp-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(here / f)
                    n += 1
        return n


def _raise_unless_gone(exc: OSError) -> None:
    """``os.walk``'s error handler: a folder removed meanwhile has no names; else fail."""
    if not isinstance(exc, FileNotFoundError):
        raise exc


# --------------------------------------------------------------------- S3

#: S3 error codes worth another attempt (throttling, server-side trouble)
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "OperationAborted",
        "BadDigest",
        "XAmzContentChecksumMismatch",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def _status_and_code(exc: BaseException) -> tuple[int, str]:
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return status, code


class S3MetadataStore(MetadataStore):
    """Objects ``<prefix>/<name>`` in one S3 bucket, through a synchronous boto3 client.

    * ``put_once``: ``PutObject`` with ``IfNoneMatch="*"``; 412
      ``PreconditionFailed`` means the key exists (False). 409
      ``ConditionalRequestConflict`` (a concurrent conditional write in
      flight) is retried up to ``conflict_attempts`` times, then
      :class:`MetadataWriteConflict`. A retried attempt after a failure the
      server may have applied anyway (5xx, timeout, lost connection) that
      then gets 412 reads the object back: the same bytes are this write's
      (records carry their creation time, so another writer's differ).
    * Every call is retried on transient errors (throttling, 5xx,
      timeouts, connection errors) up to ``attempts`` in all, with
      exponential backoff from ``backoff_s``; botocore's own retries are
      off so this is the one policy. Other errors (credentials, access
      denied, a missing bucket) raise :class:`MetadataStoreError` at once.
    * ``list`` pages through ``ListObjectsV2`` (1,000 keys a page) to the end.
    * Path-style addressing whenever an endpoint is configured (MinIO,
      SeaweedFS, Ceph); AWS keeps botocore's default.

    Thread-safety: boto3 clients are thread-safe; the store holds nothing
    else mutable. One client per store, created here (no request is made).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str = "",
        region: str = "",
        attempts: int = 4,
        backoff_s: float = 0.2,
        conflict_attempts: int = 5,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import boto3  # type: ignore[import-untyped,unused-ignore]
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._attempts = max(1, attempts)
        self._backoff_s = backoff_s
        self._conflict_attempts = max(1, conflict_attempts)
        self._sleep = sleep
        custom_endpoint = bool(
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        config = Config(
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=16,
            s3={"addressing_style": "path" if custom_endpoint else "auto"},
        )
        # a session of its own: boto3's default session is not thread-safe
        self._client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region or None,
            config=config,
        )

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _key(self, name: str) -> str:
        check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    # ------------------------------------------------------------ errors
    def _error(self, exc: BaseException, what: str) -> MetadataStoreError:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            CredentialRetrievalError,
            HTTPClientError,
            IncompleteReadError,
            NoCredentialsError,
            PartialCredentialsError,
            ReadTimeoutError,
            ResponseStreamingError,
        )

        if isinstance(exc, ClientError):
            status, code = _status_and_code(exc)
            message = exc.response.get("Error", {}).get("Message", "")
            text = f"{what}: {code or status} {message}".rstrip()
            if code == "NoSuchBucket":
                text = f"{what}: bucket {self.bucket!r} does not exist"
            transient = code in _TRANSIENT_CODES or status >= 500 or status == 429
            return MetadataStoreError(text, retryable=transient)
        if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
            return MetadataStoreError(
                f"{what}: no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, a profile, or a web identity (IRSA)"
            )
        if isinstance(
            exc,
            ConnectionError
            | HTTPClientError
            | ReadTimeoutError
            | IncompleteReadError
            | ResponseStreamingError,
        ):
            return MetadataStoreError(f"{what}: {exc}", retryable=True)
        if isinstance(exc, BotoCoreError):
            return MetadataStoreError(f"{what}: {exc}")
        raise exc

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(self._attempts):
            try:
                return call()
            except (ClientError, BotoCoreError) as exc:
                err = self._error(exc, what)
            if not err.retryable or attempt + 1 >= self._attempts:
                raise err
            self._sleep(self._backoff_s * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    # -------------------------------------------------------- operations
    def put_once(self, name: str, data: bytes) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._key(name)
        what = f"write-once of {self.describe(name)}"
        failures = conflicts = 0
        maybe_written = False
        while True:
            try:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
                return True
            except ClientError as exc:
                status, code = _status_and_code(exc)
                if status == 412 or code == "PreconditionFailed":
                    # an earlier attempt of ours may have landed before its answer was lost
                    return maybe_written and self.get(name) == data
                if status == 409 or code == "ConditionalRequestConflict":
                    conflicts += 1
                    if conflicts >= self._conflict_attempts:
                        raise MetadataWriteConflict(
                            f"{what}: {conflicts} conditional write conflicts in a row "
                            "(409 ConditionalRequestConflict): concurrent writers"
                        ) from None
                    self._sleep(self._backoff_s * 2 ** min(conflicts - 1, 5))
                    continue
                err = self._error(exc, what)
            except BotoCoreError as exc:
                err = self._error(exc, what)
            failures += 1
            if not err.retryable or failures >= self._attempts:
                raise err
            maybe_written = True
            self._sleep(self._backoff_s * 2 ** (failures - 1))

    def put(self, name: str, data: bytes) -> None:
        key = self._key(name)
        self._retrying(
            f"write of {self.describe(name)}",
            lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=data),
        )

    def get(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        key = self._key(name)

        def call() -> bytes | None:
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                status, code = _status_and_code(exc)
                if code in _NOT_FOUND_CODES or (status == 404 and code != "NoSuchBucket"):
                    return None
                raise
            with contextlib.closing(resp["Body"]) as body:
                data: bytes = body.read()
            return data

        return self._retrying(f"read of {self.describe(name)}", call)

    def list(self, prefix: str = "") -> builtins.list[str]:
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""

        def call() -> builtins.list[str]:
            names: builtins.list[str] = []
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=root + prefix
            )
            for page in pages:
                names.extend(obj["Key"][len(root) :] for obj in page.get("Contents", ()))
            return sorted(names)

        return self._retrying(f"listing of {self.describe(prefix)}", call)

    def delete(self, name: str) -> None:
        key = self._key(name)
        self._retrying(
            f"delete of {self.describe(name)}",
            lambda: self._client.delete_object(Bucket=self.bucket, Key=key),
        )

    def close(self) -> None:
        self._client.close()


# ------------------------------------------------------------------- URLs


def open_metadata_store(
    url: str, *, s3_endpoint_url: str = "", s3_region: str = "", fsync: bool = True
) -> MetadataStore:
    """The store at ``url``: a path or ``file:///abs/path`` (POSIX), ``s3://bucket[/prefix]``.

    Raises :class:`~dstl_client.core.errors.ConfigError` (one line, naming
    the supported forms) for anything else; :func:`check_metadata_url`
    checks a URL without opening anything.
    """
    kind, location, prefix = check_metadata_url(url)
    if kind == "file":
        return FileMetadataStore(location, fsync=fsync)
    return S3MetadataStore(location, prefix, endpoint_url=s3_endpoint_url, region=s3_region)


def check_metadata_url(url: str) -> tuple[str, str, str]:
    """``("file", absolute path, "")`` or ``("s3", bucket, prefix)``; else :class:`ConfigError`."""
    if not url or not url.strip():
        raise ConfigError(f"empty job metadata URL: use {SUPPORTED}")
    m = _SCHEME.match(url)
    if m is None:
        return "file", str(Path(url).absolute()), ""
    scheme = m.group(1).lower()
    parts = urlsplit(url)
    if scheme == "file":
        if parts.netloc or not parts.path.startswith("/") or parts.query or parts.fragment:
            raise ConfigError(
                f"job metadata URL {url!r}: a file URL needs an absolute path "
                "(file:///absolute/path), or give a plain path"
            )
        return "file", str(Path(parts.path)), ""
    if scheme == "s3":
        prefix = parts.path.strip("/")
        if (
            not _BUCKET.fullmatch(parts.netloc)
            or parts.query
            or parts.fragment
            or (prefix and any(p in ("", ".", "..") for p in prefix.split("/")))
        ):
            raise ConfigError(f"job metadata URL {url!r}: use s3://bucket[/prefix]")
        return "s3", parts.netloc, prefix
    if scheme in ("s3a", "s3n"):
        raise ConfigError(
            f"job metadata URL {url!r}: {scheme}:// is Hadoop's scheme; "
            f"write the same bucket and key as s3://{url.split('://', 1)[-1]}"
        )
    raise ConfigError(f"unsupported job metadata URL {url!r}: use {SUPPORTED}")
