"""What the sidecar's ``ListObjects`` tells about one object of a job."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ObjectInfo"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object of a job: its key, size in bytes and last modification time.

    ``modified`` is in seconds since the Unix epoch (when the object was
    written); ``0.0`` means the store could not tell, and a caller deciding
    by age must then treat the object as possibly just written.
    """

    key: str
    size: int
    modified: float
