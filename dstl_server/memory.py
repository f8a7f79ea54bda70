"""Giving freed memory back to the operating system (glibc only; a no-op elsewhere).

Large requests and objects are freed by Python as soon as they are done with,
but glibc keeps freed heap pages mapped, so after a burst the sidecar's RSS
stays near its peak although nothing holds the memory. ``malloc_trim(0)``
returns those pages; the server calls it periodically from one task.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


def _load_trim() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def release() -> None:
        trim(0)

    return release


_trim = _load_trim()


def release_free_memory() -> bool:
    """Return freed heap pages to the OS; False where the C library cannot."""
    if _trim is None:
        return False
    _trim()
    return True
