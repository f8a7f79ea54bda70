"""gRPC plumbing shared by the sync and async clients: errors, credentials, options."""

from __future__ import annotations

from typing import Any

import grpc

from dstl_client.core.errors import (
    ERROR_KIND_KEY,
    DstlError,
    SidecarUnavailable,
    error_class_for_kind,
)

_BY_CODE: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "unavailable",
    # the call was cancelled (channel closed, connection torn down): the outcome is unknown
    grpc.StatusCode.CANCELLED: "unavailable",
    grpc.StatusCode.UNAUTHENTICATED: "permission_denied",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_argument",
    grpc.StatusCode.NOT_FOUND: "log_not_found",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "backpressure",
    grpc.StatusCode.DATA_LOSS: "corrupt_object",
}


def to_dstl_error(exc: Any, target: str | None = None) -> DstlError:
    """The typed error a failed call stands for (from its trailer, else its code).

    ``target`` (the sidecar's address) is named in ``SidecarUnavailable``
    messages, whatever gRPC's own text says.
    """
    kind = None
    try:
        for key, value in exc.trailing_metadata() or ():
            if key == ERROR_KIND_KEY:
                kind = value
    except Exception:
        pass
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if kind is None:
        kind = _BY_CODE.get(code, "internal") if code is not None else "internal"
        if kind == "unavailable":
            where = f" at {target}" if target else ""
            return SidecarUnavailable(
                f"sidecar{where} unavailable ({code.name if code else '?'}): {details}"
            )
    cls = error_class_for_kind(kind)
    return cls(details or (code.name if code else "error"))


def credentials_and_metadata(
    token: str | None, root_certificates: bytes | None
) -> tuple[grpc.ChannelCredentials | None, tuple[tuple[str, str], ...]]:
    metadata: tuple[tuple[str, str], ...] = ()
    if token:
        metadata = (("authorization", f"Bearer {token}"),)
    creds = grpc.ssl_channel_credentials(root_certificates) if root_certificates else None
    return creds, metadata


def channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.enable_retries", 0),
    ]
