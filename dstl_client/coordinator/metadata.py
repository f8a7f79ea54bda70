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

import re
from pathlib import Path
from urllib.parse import urlsplit

from dstl_client.coordinator.metadata_file import FileMetadataStore
from dstl_client.coordinator.metadata_s3 import S3MetadataStore
from dstl_client.coordinator.metadata_store import (
    CorruptMetadata,
    MetadataStore,
    MetadataStoreError,
    MetadataWriteConflict,
    check_name,
    check_prefix,
)
from dstl_client.core.errors import ConfigError

__all__ = [
    "CorruptMetadata",
    "FileMetadataStore",
    "MetadataStore",
    "MetadataStoreError",
    "MetadataWriteConflict",
    "S3MetadataStore",
    "check_metadata_url",
    "check_name",
    "check_prefix",
    "open_metadata_store",
]

SUPPORTED = "a path, file:///absolute/path or s3://bucket[/prefix]"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


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
