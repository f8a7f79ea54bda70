"""``s3://bucket/prefix`` blob store on aioboto3 (AWS S3 or any S3-compatible server).

Invariants:

* Object ``key`` lives at ``<prefix>/<key>`` in the bucket (just ``<key>``
  without a prefix); :meth:`S3BlobStore.list` strips the prefix again (and
  adds it to ``start_after``, sent as ``StartAfter``; ``modified`` is the
  object's ``LastModified``, whole seconds on some servers). Keys
  come from :mod:`dstl_client.core.keys` (per job, then a 2-hex hash), so requests
  spread over many S3 key prefixes.
* ``put`` is one PutObject with the body's CRC32C in the
  ``x-amz-checksum-crc32c`` header: S3 stores the whole object or nothing, and
  rejects a body damaged in transit (``BadDigest``). The CRC32C is computed
  here, with the same hardware CRC32C as the object format's own checksums
  (in a worker thread past :data:`INLINE_CRC_BYTES`, off the event loop), so
  botocore computes no checksum of its own (CRC32 in zlib, read back from a
  copy), and the body reaches the socket without a copy (:class:`PutBody`).
* botocore's own retries are off (one HTTP attempt per call): the sidecar's
  uploader owns retries and hedging and needs to see every failure at once.
  Errors are mapped to :class:`~dstl_client.core.errors.StorageError` subclasses:
  throttling, 5xx, connection errors and timeouts become
  :class:`~dstl_client.core.errors.TransientStorageError` (retryable); a missing
  object :class:`~dstl_client.core.errors.BlobNotFound`; credentials, permissions,
  a missing bucket and other 4xx a non-retryable ``StorageError``.
* ``probe`` is one ListObjectsV2 of at most one key under the prefix, bounded
  by ``probe_timeout_s`` (it needs only the ListBucket permission the
  sidecar's cleanup needs anyway, and it also works for a policy limited to
  the prefix). ``sweep_leftovers`` has nothing to do: a PutObject is atomic
  on the server, an interrupted one leaves no object and no temp data behind
  (no multipart uploads are used).
* Credentials come from the standard AWS chain (``AWS_ACCESS_KEY_ID``/
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, web identity, instance
  metadata...), resolved when the client is created.

Thread/task rules: one long-lived client with a bounded connection pool
(``max_connections``) per store, created lazily by the first call on the
running event loop. From then on the store belongs to that loop: any number of
tasks on it may call concurrently; calls from another loop or thread raise
:class:`~dstl_client.core.errors.StorageError`. :meth:`close` closes the pool; the
store cannot be used after it.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    ClientError,
)

from dstl_client.core.errors import (
    ConfigError,
    InvalidArgument,
    StorageError,
    TransientStorageError,
)
from dstl_client.core.format import crc32c
from dstl_client.core.s3_errors import NOT_FOUND_CODES, TRANSIENT_CODES
from dstl_server.storage.base import BlobInfo, BlobStore, validate_key
from dstl_server.storage.s3_errors import map_s3_error

if TYPE_CHECKING:
    from dstl_server.settings import ServerSettings

__all__ = ["S3BlobStore", "map_s3_error"]


#: DeleteObjects takes at most this many keys per request
DELETE_BATCH = 1000
#: a body of at most this size has its CRC32C computed on the event loop (well
#: under 100 us); a larger one in a worker thread (the CRC releases the GIL)
INLINE_CRC_BYTES = 256 * 1024


class PutBody:
    """A put's body: the object's bytes, written to the connection as they are.

    botocore wraps a ``bytes`` body in a ``BytesIO``, which aiohttp copies
    and reads back in 64 KiB pieces (and it warns about a large ``bytes``
    body); this one is an async iterable of the one ``bytes`` object, which
    aiohttp writes whole, as the Content-Length botocore sends says. ``read``
    and ``len`` are what botocore's checks of a body look at (a body with
    ``read`` is sent after ``Expect: 100-continue``, as the ``BytesIO`` was).
    Immutable; each iteration (each attempt) yields the bytes again.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def read(self, size: int = -1) -> bytes:
        """The whole body (nothing in dstl reads it this way)."""
        return self.data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


async def checksum_crc32c(data: bytes) -> str:
    """``data``'s CRC32C as S3 takes it: base64 of the big-endian 4 bytes."""
    if len(data) <= INLINE_CRC_BYTES:
        crc = crc32c(data)
    else:
        crc = await asyncio.to_thread(crc32c, data)
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


class S3BlobStore(BlobStore):
    """Objects in one S3 bucket under an optional key prefix (see the module docstring)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        verify: bool | str = True,
        max_connections: int = 32,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        list_page_size: int = 1000,
        probe_timeout_s: float = 5.0,
    ) -> None:
        """``verify``: ``True`` (system CAs), ``False`` (no TLS verification) or
        the path of a PEM CA bundle. Explicit keys override the AWS chain.
        ``probe_timeout_s`` bounds one :meth:`probe`."""
        if not bucket:
            raise ConfigError("S3 storage needs a bucket: s3://bucket/prefix")
        prefix = prefix.strip("/")
        if prefix:
            try:
                validate_key(prefix)
            except InvalidArgument as exc:
                raise ConfigError(f"bad S3 key prefix {prefix!r}: {exc.message}") from None
        if max_connections <= 0 or not 0 < list_page_size <= 1000:
            raise ConfigError("max_connections must be > 0 and list_page_size in 1..1000")
        if not probe_timeout_s > 0:
            raise ConfigError(f"probe_timeout_s must be > 0, got {probe_timeout_s}")
        self.probe_timeout_s = probe_timeout_s
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.endpoint_url = endpoint_url or None
        self.list_page_size = list_page_size
        self._verify: bool | str | None = None if verify is True else verify
        self._credentials = {
            "aws_access_key_id": aws_access_key_id,
            "aws_secret_access_key": aws_secret_access_key,
            "aws_session_token": aws_session_token,
        }
        self._config = AioConfig(
            region_name=region or None,
            signature_version="s3v4",
            max_pool_connections=max_connections,
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            # One HTTP attempt per call: the uploader retries and hedges.
            retries={"total_max_attempts": 1, "mode": "standard"},
            # Custom endpoints (MinIO, SeaweedFS, Ceph, IP addresses) need
            # path-style; AWS itself keeps its default.
            s3={
                "addressing_style": "path" if endpoint_url else "auto",
                # no SHA-256 of the body in the signature, also over plain HTTP: the
                # CRC32C checksum already protects it (S3 rejects a damaged body) and
                # every section carries its own CRC; hashing cost 15 % of the
                # sidecar's CPU in a materialization
                "payload_signing_enabled": False,
            },
            # put sends its own CRC32C; no other call carries a body to checksum
            request_checksum_calculation="when_required",
            response_checksum_validation="when_supported",
            tcp_keepalive=True,
        )
        self._client: Any = None
        self._client_cm: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False

    @classmethod
    def from_url(cls, url: str, settings: ServerSettings | None = None) -> S3BlobStore:
        """Open ``s3://bucket/prefix`` with the S3 options of ``settings``."""
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.hostname:
            raise ConfigError(f"expected s3://bucket/prefix, got {url!r}")
        if parsed.username or parsed.password or parsed.port or parsed.query or parsed.fragment:
            raise ConfigError(
                f"s3:// URL takes only a bucket and a prefix (credentials come from the "
                f"AWS chain): {url!r}"
            )
        opts: dict[str, Any] = {}
        if settings is not None:
            verify: bool | str = settings.s3_verify_tls
            if settings.s3_verify_tls and settings.s3_ca_bundle:
                verify = settings.s3_ca_bundle
            opts = {
                "endpoint_url": settings.s3_endpoint_url or None,
                "region": settings.s3_region or None,
                "verify": verify,
                "max_connections": settings.s3_max_connections,
                "read_timeout_s": max(settings.upload_timeout_s, 5.0),
                "probe_timeout_s": min(settings.upload_timeout_s, 5.0),
            }
        # netloc keeps the bucket's case; S3 bucket names are lower case anyway
        return cls(parsed.netloc, parsed.path, **opts)

    # -------------------------------------------------------------- client
    async def _get_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise StorageError(f"{self.url}: store is closed", retryable=False)
        if self._client is not None:
            if loop is not self._loop:
                raise StorageError(
                    f"{self.url}: store used from another event loop", retryable=False
                )
            return self._client
        if self._lock is None or self._loop is not loop:
            self._lock = asyncio.Lock()
            self._loop = loop
        async with self._lock:
            if self._client is None:
                session = aioboto3.Session()
                cm = session.client(
                    "s3",
                    endpoint_url=self.endpoint_url,
                    verify=self._verify,
                    config=self._config,
                    **self._credentials,
                )
                try:
                    self._client = await cm.__aenter__()
                except Exception as exc:
                    raise map_s3_error(exc, f"open S3 client for {self.url}") from exc
                self._client_cm = cm
            return self._client

    def _full(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full(key)}"

    # ----------------------------------------------------------- operations
    async def put(self, key: str, data: bytes) -> None:
        full = self._full(key)
        client = await self._get_client()
        checksum = await checksum_crc32c(data)
        try:
            await client.put_object(
                Bucket=self.bucket,
                Key=full,
                Body=PutBody(data),
                ContentLength=len(data),
                ContentType="application/octet-stream",
                ChecksumCRC32C=checksum,
            )
        except Exception as exc:
            raise map_s3_error(exc, f"put {self._where(key)}") from exc

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        if offset < 0 or (length is not None and length < 0):
            raise InvalidArgument(f"bad range offset={offset} length={length}")
        full = self._full(key)
        client = await self._get_client()
        what = f"get {self._where(key)}"
        try:
            if length == 0:
                # No byte range can express "nothing"; still report a missing key.
                await client.head_object(Bucket=self.bucket, Key=full)
                return b""
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
            if offset or length is not None:
                end = "" if length is None else str(offset + length - 1)
                kwargs["Range"] = f"bytes={offset}-{end}"
            try:
                resp = await client.get_object(**kwargs)
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if exc.response.get("Error", {}).get("Code") == "InvalidRange" or status == 416:
                    return b""  # the range starts at or past the end
                raise
            async with resp["Body"] as body:
                data: bytes = await body.read()
        except Exception as exc:
            raise map_s3_error(exc, what) from exc
        if length is not None and len(data) > length:
            # A server that ignored the Range header sent the whole object.
            raise StorageError(f"{what}: asked {length} bytes, got {len(data)}", retryable=False)
        return data

    async def delete(self, keys: Sequence[str]) -> int:
        fulls = [self._full(k) for k in keys]
        if not fulls:
            return 0
        client = await self._get_client()
        failed: builtins.list[str] = []
        transient = True
        for i in range(0, len(fulls), DELETE_BATCH):
            batch = fulls[i : i + DELETE_BATCH]
            try:
                resp = await client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            except Exception as exc:
                raise map_s3_error(
                    exc, f"delete {len(batch)} objects in s3://{self.bucket}"
                ) from exc
            for err in resp.get("Errors", ()):
                code = str(err.get("Code", ""))
                if code in NOT_FOUND_CODES:
                    continue
                transient = transient and code in TRANSIENT_CODES
                failed.append(f"{err.get('Key')}: {code} {err.get('Message', '')}".rstrip())
        if failed:
            shown = "; ".join(failed[:5]) + (
                f"; ... {len(failed) - 5} more" if len(failed) > 5 else ""
            )
            raise StorageError(
                f"delete in s3://{self.bucket}: {len(failed)} of {len(fulls)} failed: {shown}",
                retryable=transient,
            )
        return len(fulls)

    async def list(self, prefix: str = "", start_after: str = "") -> AsyncIterator[BlobInfo]:
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        client = await self._get_client()
        paginator = client.get_paginator("list_objects_v2")
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
        if start_after:
            kwargs["StartAfter"] = f"{self.prefix}/{start_after}" if self.prefix else start_after
        pages = paginator.paginate(**kwargs, PaginationConfig={"PageSize": self.list_page_size})
        try:
            async for page in pages:
                for obj in page.get("Contents", ()):
                    modified = obj.get("LastModified")
                    yield BlobInfo(
                        obj["Key"][strip:],
                        int(obj["Size"]),
                        modified.timestamp() if modified is not None else 0.0,
                    )
        except Exception as exc:
            raise map_s3_error(exc, f"list s3://{self.bucket}/{full_prefix}") from exc

    async def probe(self) -> None:
        """List at most one key under the prefix within ``probe_timeout_s``.

        A timeout or connection failure raises
        :class:`~dstl_client.core.errors.TransientStorageError`; a missing bucket,
        bad credentials or a denied listing a non-retryable ``StorageError``.
        """
        where = f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}"
        what = f"probe {where} at {self.endpoint_url or 'AWS S3'}"
        client = await self._get_client()
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                await client.list_objects_v2(
                    Bucket=self.bucket,
                    Prefix=f"{self.prefix}/" if self.prefix else "",
                    MaxKeys=1,
                )
        except TimeoutError as exc:
            raise TransientStorageError(
                f"{what}: timed out after {self.probe_timeout_s:g}s"
            ) from exc
        except Exception as exc:
            raise map_s3_error(exc, what) from exc

    async def sweep_leftovers(self, older_than_s: float) -> int:
        """Nothing to sweep: PutObject is atomic, an interrupted one leaves nothing."""
        return 0

    async def close(self) -> None:
        """Close the connection pool (idempotent); the store is unusable after."""
        self._closed = True
        cm, self._client_cm, self._client = self._client_cm, None, None
        if cm is not None:
            with contextlib.suppress(Exception):
                await cm.__aexit__(None, None, None)
