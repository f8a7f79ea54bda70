"""The dstl exception hierarchy, shared by the sidecar and its clients.

Every error the service can report is a subclass of :class:`DstlError`. Each
class carries the gRPC status code it maps to (``grpc_code``, by name so this
module does not import grpc) and the server maps an exception to a status once,
in one place; the client maps the status back to the same class, so callers
catch the same types in-process and over the wire.

Storage errors carry ``retryable``: the uploader's retry policy decides from the
type alone (a 503 or a reset connection is retried, a 403 is not).
"""

from __future__ import annotations

__all__ = [
    "ERROR_KIND_KEY",
    "Backpressure",
    "BlobNotFound",
    "BudgetFull",
    "CallLost",
    "ChangeTooLarge",
    "ConfigError",
    "CorruptObject",
    "DstlError",
    "InvalidArgument",
    "InvalidHandle",
    "KeyGroupOutOfRange",
    "LogNotFound",
    "PermissionDenied",
    "RequestTooLarge",
    "ShuttingDown",
    "SidecarUnavailable",
    "SqnOutOfRange",
    "StorageError",
    "TooManyWriters",
    "TransientStorageError",
    "Unauthenticated",
    "UploadFailed",
    "WriterClosed",
    "WriterFailed",
    "error_class_for_kind",
]

#: the trailer (gRPC trailing metadata) that carries a refused call's error ``kind``:
#: the server writes it, the client reads it back into the same class
ERROR_KIND_KEY = "dstl-error-kind"


class DstlError(Exception):
    """Base class of every error raised by dstl."""

    grpc_code: str = "INTERNAL"
    #: stable short name that travels in gRPC trailing metadata
    kind: str = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(DstlError):
    """A setting is missing, malformed or out of range."""

    grpc_code = "INVALID_ARGUMENT"
    kind = "config"


class InvalidArgument(DstlError):
    """A request is malformed (bad id, empty batch, wrong types...)."""

    grpc_code = "INVALID_ARGUMENT"
    kind = "invalid_argument"


class KeyGroupOutOfRange(InvalidArgument):
    """A change names a key group outside its writer's key-group range."""

    kind = "key_group_out_of_range"


class ChangeTooLarge(InvalidArgument):
    """A single change is larger than ``max_change_bytes``."""

    kind = "change_too_large"


class SqnOutOfRange(InvalidArgument):
    """An SQN the writer has not reached yet (from the future)."""

    kind = "sqn_out_of_range"


class InvalidHandle(InvalidArgument):
    """Handle bytes that do not decode, or a handle inconsistent with itself."""

    kind = "invalid_handle"


class LogNotFound(DstlError):
    """The log id is unknown: never created, closed, or the sidecar restarted.

    After a sidecar restart every writer's unpersisted changes are gone; the
    writer must be recreated and the job must recover from its last checkpoint.
    """

    grpc_code = "NOT_FOUND"
    kind = "log_not_found"


class WriterClosed(DstlError):
    """The writer was closed by its owner; no more calls are possible."""

    grpc_code = "FAILED_PRECONDITION"
    kind = "writer_closed"


class CallLost(DstlError):
    """An earlier call of this writer never reached the sidecar.

    The log may have a hole, so the writer cannot go on: recreate it and
    recover from the last checkpoint.
    """

    grpc_code = "FAILED_PRECONDITION"
    kind = "call_lost"


class WriterFailed(DstlError):
    """An earlier call of this writer failed in a way that may have lost changes.

    Raised by the client for every call after a failed send of appended
    changes (an ``Append`` refused under backpressure, a persist that carried
    changes and failed, a lost connection): ``append()`` had already returned
    for those changes, so the writer can no longer promise a complete log.
    Sticky: every later call raises it until the writer is recreated and the
    job recovers from its last checkpoint. ``cause`` is the original error.
    The sidecar raises it too, for later calls of a session whose
    data-carrying call it refused.
    """

    grpc_code = "FAILED_PRECONDITION"
    kind = "writer_failed"

    def __init__(self, message: str, *, cause: DstlError | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class PermissionDenied(DstlError):
    """A caller asked for logs, handles or objects of a job its credential is not for."""

    grpc_code = "PERMISSION_DENIED"
    kind = "permission_denied"


class Unauthenticated(PermissionDenied):
    """No credential, or one the sidecar does not accept (wrong, malformed, too weak)."""

    grpc_code = "UNAUTHENTICATED"
    kind = "unauthenticated"


class TooManyWriters(DstlError):
    """A writer quota is full: the node's ``max_writers`` or the job's ``max_writers_per_job``."""

    grpc_code = "RESOURCE_EXHAUSTED"
    kind = "too_many_writers"


class Backpressure(DstlError):
    """Bytes not yet uploaded stayed above the limit for the whole timeout."""

    grpc_code = "RESOURCE_EXHAUSTED"
    kind = "backpressure"


class BudgetFull(Backpressure):
    """Refused at once: the sidecar's memory budget is full; nothing was applied.

    Retryable: the call may be sent again as it was (the client library does,
    with backoff, while the sidecar keeps answering this). A writer pushed
    back for longer than the sidecar's ``backpressure_timeout_s`` gets a
    plain :class:`Backpressure`, which fails it.
    """

    kind = "budget_full"


class RequestTooLarge(DstlError):
    """A request holds more bytes, or more items of a list, than its method accepts.

    Refused before the request is decoded, so its cost stays bounded by the
    method's limit and not by a number the caller wrote.
    """

    grpc_code = "RESOURCE_EXHAUSTED"
    kind = "request_too_large"


class ShuttingDown(DstlError):
    """The sidecar is stopping and accepts no new work."""

    grpc_code = "UNAVAILABLE"
    kind = "shutting_down"


class SidecarUnavailable(DstlError):
    """The sidecar cannot be reached (not running, wrong address, network)."""

    grpc_code = "UNAVAILABLE"
    kind = "unavailable"


class UploadFailed(DstlError):
    """The upload carrying these changes failed after every attempt.

    The changes stay in the sidecar (nothing is lost while the writer lives);
    the next ``persist_durably`` uploads them again.
    """

    grpc_code = "UNAVAILABLE"
    kind = "upload_failed"


class StorageError(DstlError):
    """A blob store operation failed. ``retryable`` tells the retry policy."""

    grpc_code = "UNAVAILABLE"
    kind = "storage"
    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class TransientStorageError(StorageError):
    """Throttling, 5xx, reset connections, timeouts: worth another attempt."""

    kind = "storage_transient"
    retryable = True


class BlobNotFound(StorageError):
    """The object does not exist (deleted, never written, wrong key)."""

    grpc_code = "NOT_FOUND"
    kind = "blob_not_found"
    retryable = False


class CorruptObject(DstlError):
    """An object or section failed its checksum or structure checks.

    Never returned as data: a reader raises this instead.
    """

    grpc_code = "DATA_LOSS"
    kind = "corrupt_object"


_BY_KIND: dict[str, type[DstlError]] = {}


def _register(cls: type[DstlError]) -> None:
    _BY_KIND[cls.kind] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(DstlError)


def error_class_for_kind(kind: str) -> type[DstlError]:
    """The exception class with this ``kind`` (``DstlError`` when unknown)."""
    return _BY_KIND.get(kind, DstlError)
