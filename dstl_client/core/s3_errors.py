"""S3 answers, classified once: worth another attempt, or "no such object".

The one table for every S3 client of the project: the sidecar's blob store
(:mod:`dstl_server.storage.s3_errors`) and the driver's metadata store
(:mod:`dstl_client.coordinator.metadata_s3`) both decide here. Pure data and
functions, no botocore import: any thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NOT_FOUND_CODES", "TRANSIENT_CODES", "is_transient", "status_and_code"]

#: error codes of a missing object (a missing bucket, ``NoSuchBucket``, is not one)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})

#: error codes worth another attempt: throttling, server-side trouble, a damaged body
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


def is_transient(code: str, status: int = 0) -> bool:
    """Whether an S3 error (its code, and HTTP status when known) is worth another attempt.

    A code of :data:`TRANSIENT_CODES`, any 5xx, or 429 (too many requests).
    """
    return code in TRANSIENT_CODES or status >= 500 or status == 429


def status_and_code(response: Mapping[str, Any] | None) -> tuple[int, str]:
    """``(HTTP status, error code)`` of a botocore error response (``ClientError.response``).

    Missing parts are ``0`` and ``""``.
    """
    response = response or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return status, code
