"""S3 and botocore errors mapped onto the dstl storage errors (retryable or not, by type).

Throttling, 5xx (the table: :mod:`dstl_client.core.s3_errors`), connection
errors and timeouts become
:class:`~dstl_client.core.errors.TransientStorageError` (retryable); a missing
object :class:`~dstl_client.core.errors.BlobNotFound`; credentials,
permissions, a missing bucket and other 4xx a non-retryable ``StorageError``.
Pure functions, any thread.
"""

from __future__ import annotations

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    SSLError,
)

from dstl_client.core.errors import BlobNotFound, StorageError, TransientStorageError
from dstl_client.core.s3_errors import NOT_FOUND_CODES, is_transient, status_and_code

__all__ = ["map_s3_error"]


def map_s3_error(exc: BaseException, what: str) -> StorageError:
    """The :class:`StorageError` for an exception raised by aiobotocore/aiohttp.

    ``what`` names the operation and object for the message.
    """
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, ClientError):
        status, code = status_and_code(exc.response)
        message = exc.response.get("Error", {}).get("Message", "")
        msg = f"{what}: {code or status} {message}".rstrip()
        if code in NOT_FOUND_CODES:
            return BlobNotFound(msg)
        if is_transient(code, status):
            return TransientStorageError(msg)
        return StorageError(msg, retryable=False)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
        return StorageError(f"{what}: no usable AWS credentials: {exc}", retryable=False)
    if isinstance(exc, SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return StorageError(
            f"{what}: TLS certificate of the S3 endpoint not trusted "
            f"(set --s3-ca-bundle or --no-s3-verify-tls): {exc}",
            retryable=False,
        )
    if isinstance(
        exc,
        HTTPClientError
        | EndpointConnectionError
        | ConnectTimeoutError
        | SSLError
        | IncompleteReadError
        | FlexibleChecksumError
        | aiohttp.ClientError
        | TimeoutError
        | ConnectionError,
    ):
        return TransientStorageError(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, BotoCoreError):
        return StorageError(f"{what}: {type(exc).__name__}: {exc}", retryable=False)
    return StorageError(f"{what}: unexpected {type(exc).__name__}: {exc}", retryable=False)
