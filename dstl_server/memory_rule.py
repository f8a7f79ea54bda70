"""The sidecar's memory rule: what a container's memory limit must leave room for.

One rule, stated in docs/sidecar.md ("Memory") and checked in two places:
the Helm chart refuses to render a ``resources.limits.memory`` below it
(``dstl.memoryRule`` in deploy/helm/dstl/templates/_helpers.tpl, the same
constants), and ``dstl-server`` logs one WARNING at start when the cgroup
memory limit it runs under is below it (:func:`warn_if_memory_short`)::

    limit >= 2 x max_in_flight_bytes + read_cache_bytes + max_request_bytes + 160 MiB

* ``2 x max_in_flight_bytes``: the change bytes the budget admits, plus the
  copy that encoding an object for upload holds while its changes are still
  held (measured: peak RSS grows by 2.0-2.05 bytes per byte of
  ``max_in_flight_bytes``, with the default and with a whole-budget batch);
* ``read_cache_bytes``: bodies kept for reads (a bounded LRU);
* ``max_request_bytes``: one request of the largest size being received and
  decoded before the budget sees it (a request the budget refuses is freed);
* :data:`OVERHEAD_BYTES`: the interpreter, gRPC, the S3 client, metrics and
  writers' bookkeeping (idle RSS measured 54 MiB with ``file://``, 85 MiB with
  ``s3://``; 1,000 writers add about 24 MiB).

Pure functions; any thread may call them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dstl_server.settings import ServerSettings

log = logging.getLogger(__name__)

MiB = 1024 * 1024
#: the fixed part of the rule (see the module doc for what it covers)
OVERHEAD_BYTES = 160 * MiB
#: each byte of max_in_flight_bytes may be held twice (changes + the object encoded from them)
IN_FLIGHT_FACTOR = 2
#: where a container's memory limit is visible: cgroup v2, then v1
CGROUP_LIMIT_FILES = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)
#: cgroup v1 writes "no limit" as a huge number (page-rounded 2**63 - 1); anything above is none
_NO_LIMIT_ABOVE = 1 << 62


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    """The parts of the rule for one set of settings, in bytes."""

    in_flight_bytes: int
    read_cache_bytes: int
    request_bytes: int
    overhead_bytes: int = OVERHEAD_BYTES

    @property
    def total(self) -> int:
        return (
            self.in_flight_bytes + self.read_cache_bytes + self.request_bytes + self.overhead_bytes
        )

    def explain(self) -> str:
        """``2 x max_in_flight_bytes (200 MiB) + ... = 488 MiB``."""
        return (
            f"{IN_FLIGHT_FACTOR} x max_in_flight_bytes ({mib(self.in_flight_bytes)}) "
            f"+ read_cache_bytes ({mib(self.read_cache_bytes)}) "
            f"+ max_request_bytes ({mib(self.request_bytes)}) "
            f"+ {mib(self.overhead_bytes)} overhead = {mib(self.total)}"
        )


def mib(nbytes: float) -> str:
    """Bytes as MiB, as the chart writes them (``488 MiB``, ``0.5 MiB``)."""
    return f"{nbytes / MiB:.6g} MiB"


def memory_needed(settings: ServerSettings) -> MemoryNeed:
    """What a container running ``dstl-server`` with ``settings`` must be allowed to hold."""
    return MemoryNeed(
        in_flight_bytes=IN_FLIGHT_FACTOR * settings.max_in_flight_bytes,
        read_cache_bytes=settings.read_cache_bytes,
        request_bytes=settings.max_request_bytes,
    )


def memory_shortfall(limit_bytes: int, settings: ServerSettings) -> str | None:
    """Why ``limit_bytes`` is too small for ``settings`` (one line), or None when it fits."""
    need = memory_needed(settings)
    if limit_bytes >= need.total:
        return None
    return (
        f"the container's memory limit of {mib(limit_bytes)} is below what these settings "
        f"can hold: {need.explain()}; an OOM kill loses every change not yet persisted "
        "on this node. Raise the limit or lower those settings (docs/sidecar.md, 'Memory')"
    )


def cgroup_memory_limit(files: Sequence[Path] = CGROUP_LIMIT_FILES) -> int | None:
    """The memory limit of the cgroup this process runs in, or None where none is visible.

    Reads the first of ``files`` that exists: cgroup v2 ``memory.max``
    (``max`` is no limit) or v1 ``memory.limit_in_bytes`` (a huge number is
    no limit). Unreadable or malformed files count as no limit.
    """
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if not text.isdigit():  # "max" (v2: unlimited) or garbage
            return None
        value = int(text)
        return value if 0 < value <= _NO_LIMIT_ABOVE else None
    return None


def warn_if_memory_short(
    settings: ServerSettings, files: Sequence[Path] = CGROUP_LIMIT_FILES
) -> str | None:
    """Log one WARNING when the visible cgroup limit is below the rule; return its text."""
    limit = cgroup_memory_limit(files)
    if limit is None:
        return None
    short = memory_shortfall(limit, settings)
    if short is not None:
        need = memory_needed(settings)
        log.warning(
            "%s",
            short,
            extra={
                "memory_limit_bytes": limit,
                "memory_needed_bytes": need.total,
                "max_in_flight_bytes": settings.max_in_flight_bytes,
                "read_cache_bytes": settings.read_cache_bytes,
                "max_request_bytes": settings.max_request_bytes,
                "overhead_bytes": need.overhead_bytes,
            },
        )
    return short
