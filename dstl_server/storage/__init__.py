"""Blob stores: where the sidecar's objects live."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlparse

from dstl_client.core.errors import ConfigError
from dstl_server.storage.base import BlobInfo, BlobStore
from dstl_server.storage.local import LocalBlobStore

if TYPE_CHECKING:
    from dstl_server.settings import ServerSettings

__all__ = ["BlobInfo", "BlobStore", "LocalBlobStore", "open_store"]


def open_store(url: str, settings: ServerSettings | None = None) -> BlobStore:
    """Open a store from a URL: ``file:///path`` or ``s3://bucket/prefix``.

    ``settings`` supplies the store options (fsync, S3 endpoint, TLS, pool size).
    """
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"file:// URL must be absolute (file:///path), got {url!r}")
        if not parsed.path:
            raise ConfigError(f"file:// URL without a path: {url!r}")
        try:
            return LocalBlobStore(parsed.path, fsync=settings.fsync if settings else True)
        except OSError as exc:  # the directory cannot be created
            raise ConfigError(
                f"setting storage={url!r}: cannot create the directory {parsed.path}: "
                f"{exc.strerror or exc}"
            ) from None
    if parsed.scheme == "s3":
        try:
            from dstl_server.storage.s3 import S3BlobStore  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:  # pragma: no cover - the S3 store ships with the package
            raise ConfigError(f"S3 storage is not available: {exc}") from exc
        store: BlobStore = S3BlobStore.from_url(url, settings)
        return store
    raise ConfigError(f"unsupported storage URL {url!r}: use file:///path or s3://bucket/prefix")
