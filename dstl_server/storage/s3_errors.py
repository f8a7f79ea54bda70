"""S3 and botocore errors mapped onto the dstl storage errors (retryable or not, by type).

Throttling, 5xx, connection errors and timeouts become
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

__all__ = ["NOT_FOUND_CODES", "TRANSIENT_CODES", "map_s3_error"]

NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "OperationAborted",
        # The body arrived damaged (checksum or MD5 mismatch): a new attempt
        # sends it again.
        "BadDigest",
        "XAmzContentChecksumMismatch",
        "XAmzContentSHA256Mismatch",
        "500",
        "502",
        "503",
        "504",
    }
)


def map_s3_error(exc: BaseException, what: str) -> StorageError:
    """The :class:`StorageError` for an exception raised by aiobotocore/aiohttp.

    ``what`` names the operation and object for the message.
    """
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        msg = f"{what}: {code or status} {err.get('Message', '')}".rstrip()
        if code in NOT_FOUND_CODES:
            return BlobNotFound(msg)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
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
