"""Build the sidecar image with podman and start it for real (``make image-test``).

No Docker engine and no registry are needed: the base image is made here from
Debian packages and the Python packages come from the host.

1. The tools: ``podman`` with ``runc`` and ``mmdebstrap``, installed with
   apt-get when missing (as root; CI runs as root on Debian).
2. The base: ``mmdebstrap --variant=minbase`` of Debian bookworm with its
   ``python3`` (3.11) and a virtual environment in ``/opt/python`` put first on
   ``PATH`` (Debian's own Python is "externally managed": pip refuses to install
   into it), imported with ``podman import``. It stands in for the public
   ``python:3.12-slim-bookworm`` base through the Dockerfile's ``BASE_IMAGE``
   argument. Cached: the image (tagged with a hash of how it is made) is made
   once per machine.
3. The wheels: the builder stage runs ``pip wheel``, which needs an index, and
   the build runs with no network. So every wheel it needs (dstl's runtime
   dependencies at the versions of deploy/docker/constraints.txt, plus
   setuptools and wheel for the build of dstl itself) is downloaded on the host
   for the base's Python and platform into ``build/image-test/wheelhouse`` (kept),
   mounted into the build (``podman build --volume``) and named by the
   ``PIP_NO_INDEX``/``PIP_FIND_LINKS`` build arguments.
4. The build: ``deploy/docker/sidecar.Dockerfile`` on a context holding exactly
   what its ``.dockerignore`` keeps, ``--network none``.
5. The run, as the chart runs it (read-only root, no capabilities, no new
   privileges) on the host's network namespace so the sidecar's loopback
   listeners are the host's: it must print ``READY``, answer the gRPC health
   check (``grpc.health.v1``, from this process), serve ``/metrics``, run as a
   non-root uid (the Dockerfile's ``USER``), report the project's version, and
   stop on SIGTERM with exit code 0.

Podman on this kind of machine (a container itself) needs ``runc``, ``--ulimit
host`` and ``default_ulimits = []`` (a containers.conf of this run's own,
``CONTAINERS_CONF``; the system's is not changed).

Usage: python tools/image_test.py [--keep-image]. Prints one line per step with
its time; exits non-zero with the reason on the first failure. Everything it
starts (the container) is removed also when a step fails.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "docker" / "sidecar.Dockerfile"
IGNOREFILE = DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore")
CONSTRAINTS = ROOT / "deploy" / "docker" / "constraints.txt"
WORK = ROOT / "build" / "image-test"
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

SUITE = "bookworm"
#: the base's packages: Debian's Python and what ``python3 -m venv`` needs (ensurepip)
BASE_PACKAGES = ("python3", "python3-venv")
#: where the base's virtual environment lives; first on PATH, as /usr/local is in python:*
BASE_VENV = "/opt/python"
BASE_PATH = f"{BASE_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: documentation, manual pages and locales are left out of the base (smaller, faster)
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
IMAGE = f"localhost/dstl-sidecar:{VERSION}-image-test"
#: the tools and the Debian packages they come from
TOOLS = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
STEP_TIMEOUT_S = 900.0
READY_TIMEOUT_S = 60.0


class ImageTestError(Exception):
    """A step failed; the message says which and why."""


@dataclass(frozen=True)
class Ready:
    """The fields of the sidecar's READY line."""

    line: str
    grpc: str
    metrics_port: int


def log(msg: str) -> None:
    print(f"image-test: {msg}", flush=True)


def run(
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = STEP_TIMEOUT_S,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """One command; its output is kept and shown when it fails."""
    result = subprocess.run(
        list(args), env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and result.returncode != 0:
        tail = (result.stdout + result.stderr)[-4000:]
        raise ImageTestError(f"`{' '.join(args)}` exited {result.returncode}:\n{tail}")
    return result


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    start = time.monotonic()
    yield
    log(f"{name}: {time.monotonic() - start:.1f} s")


# ----------------------------------------------------------------------- tools
def ensure_tools() -> None:
    """podman, runc and mmdebstrap on PATH; apt-get installs the missing ones (root only)."""
    missing = sorted({pkg for cmd, pkg in TOOLS.items() if shutil.which(cmd) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageTestError(
            f"missing {', '.join(missing)}: install them (Debian: apt-get install {' '.join(missing)})"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=env)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing, "uidmap"], env=env)


def podman_env(work: Path) -> dict[str, str]:
    """The environment of every podman call: this run's containers.conf."""
    conf = work / "containers.conf"
    conf.write_text(
        "# written by tools/image_test.py: runc, and no default ulimits (a container\n"
        "# may not raise its limits here; the runs pass --ulimit host)\n"
        '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'
    )
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


# ------------------------------------------------------------------------ base
def base_recipe() -> list[str]:
    """The mmdebstrap arguments (less the output path): what the base is made of."""
    return [
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
        *(f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES),
        f'--customize-hook=chroot "$1" python3 -m venv {BASE_VENV}',
        SUITE,
    ]


def base_image() -> str:
    """The base's tag: a hash of its recipe, so a changed recipe makes a new one."""
    digest = hashlib.sha256("\0".join([*base_recipe(), BASE_PATH]).encode()).hexdigest()[:12]
    return f"localhost/dstl-image-test-base:{SUITE}-{digest}"


def ensure_base(env: dict[str, str], work: Path) -> str:
    image = base_image()
    if run(["podman", "image", "exists", image], env=env, check=False).returncode == 0:
        log(f"base {image}: cached")
        return image
    rootfs = work / "rootfs.tar"
    rootfs.unlink(missing_ok=True)
    with step(f"base {image}: mmdebstrap {SUITE} ({', '.join(BASE_PACKAGES)})"):
        run(["mmdebstrap", "--quiet", *base_recipe(), str(rootfs)])
    with step("base: podman import"):
        run(
            [
                "podman",
                "import",
                "--change",
                f"ENV PATH={BASE_PATH}",
                "--change",
                "ENV LANG=C.UTF-8",
                str(rootfs),
                image,
            ],
            env=env,
        )
    rootfs.unlink()
    return image


def in_base(env: dict[str, str], image: str, code: str) -> str:
    """What ``python -c code`` prints in the base (no network)."""
    return run(
        [
            "podman",
            "run",
            "--rm",
            "--ulimit",
            "host",
            "--network",
            "none",
            image,
            "python",
            "-c",
            code,
        ],
        env=env,
    ).stdout.strip()


# --------------------------------------------------------------- context, wheels
def kept_paths() -> list[str]:
    """What the Dockerfile's .dockerignore keeps (its ``!`` lines)."""
    return [
        line.strip()[1:].rstrip("/")
        for line in IGNOREFILE.read_text().splitlines()
        if line.strip().startswith("!")
    ]


def make_context(work: Path) -> Path:
    """The build context: the kept paths of the checkout, no caches."""
    context = work / "context"
    shutil.rmtree(context, ignore_errors=True)
    for rel in kept_paths():
        src, dest = ROOT / rel, context / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest)
    return context


def manylinux_platforms(libc: str, machine: str) -> list[str]:
    """The wheel platform tags a glibc ``libc`` (``2.36``) on ``machine`` runs."""
    major, minor = (int(x) for x in libc.split("."))
    if major != 2 or minor < 17:
        raise ImageTestError(f"glibc {libc}: expected 2.17 or newer")
    tags = [f"manylinux_2_{m}_{machine}" for m in range(17, minor + 1)]
    return [*tags, f"manylinux2014_{machine}"]


def make_wheelhouse(work: Path, context: Path, python: str, libc: str, machine: str) -> Path:
    """Every wheel the builder stage needs, for the base's Python and platform."""
    # kept between runs (pip skips what is there); a wheel of another version than the
    # constraints pin is never chosen by the build
    wheelhouse = work / "wheelhouse"
    own = work / "own-wheel"
    shutil.rmtree(own, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run(
        [
            *pip,
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(own),
            str(context),
        ]
    )
    (dstl_wheel,) = own.glob("dstl-*.whl")
    platforms = [f"--platform={p}" for p in manylinux_platforms(libc, machine)]
    run(
        [
            *(*pip, "download", "--quiet", "--only-binary=:all:"),
            f"--python-version={python}",
            "--implementation=cp",
            f"--abi=cp{python.replace('.', '')}",
            *platforms,
            f"--constraint={CONSTRAINTS}",
            *("--dest", str(wheelhouse)),
            str(dstl_wheel),
            "setuptools>=68",
            "wheel",
        ]
    )
    for built in wheelhouse.glob("dstl-*.whl"):
        built.unlink()  # the builder makes its own, from the context
    shutil.rmtree(own)
    return wheelhouse


# ------------------------------------------------------------------ build, run
def build(env: dict[str, str], base: str, context: Path, wheelhouse: Path) -> None:
    run(
        [
            *("podman", "build", "--network", "none"),
            *("--file", str(DOCKERFILE), "--tag", IMAGE),
            *("--build-arg", f"BASE_IMAGE={base}"),
            *("--build-arg", "PIP_NO_INDEX=1", "--build-arg", "PIP_FIND_LINKS=/wheelhouse"),
            *("--volume", f"{wheelhouse}:/wheelhouse:ro"),
            str(context),
        ],
        env=env,
    )
    labels = run(
        ["podman", "image", "inspect", "--format", "{{json .Labels}}", IMAGE], env=env
    ).stdout
    for expected in (f'"org.opencontainers.image.version":"{VERSION}"', f'"{base}"'):
        if expected not in labels:
            raise ImageTestError(f"the image's labels lack {expected}: {labels}")


def wait_ready(env: dict[str, str], name: str) -> Ready:
    """The READY line of the container's output (bounded; fails if the container exits)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    pattern = re.compile(r"^READY .*$", re.MULTILINE)
    while True:
        logs = run(["podman", "logs", name], env=env, check=False)
        found = pattern.search(logs.stdout)
        if found:
            fields = dict(part.split("=", 1) for part in found.group(0).split()[1:])
            return Ready(found.group(0), fields["grpc"], int(fields["metrics_port"]))
        state = run(
            ["podman", "inspect", "--format", "{{.State.Status}}", name], env=env, check=False
        ).stdout.strip()
        if state not in ("running", "created", "configured"):
            raise ImageTestError(
                f"the container is {state} before READY:\n{logs.stdout}{logs.stderr}"
            )
        if time.monotonic() > deadline:
            raise ImageTestError(
                f"no READY line in {READY_TIMEOUT_S:.0f} s:\n{logs.stdout}{logs.stderr}"
            )
        time.sleep(0.3)


def health(address: str) -> str:
    """The sidecar's answer to grpc.health.v1 Check (overall server)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def metrics(port: int) -> list[str]:
    """The dstl_ sample lines of ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        if resp.status != 200:
            raise ImageTestError(f"/metrics answered {resp.status}")
        text = resp.read().decode()
    return [line for line in text.splitlines() if line.startswith("dstl_")]


def process_uids(env: dict[str, str], name: str) -> list[int]:
    """The real, effective, saved and filesystem uids of the container's PID 1."""
    status = run(["podman", "exec", name, "cat", "/proc/1/status"], env=env).stdout
    found = re.search(r"^Uid:\s+(.*)$", status, re.MULTILINE)
    if found is None:
        raise ImageTestError(f"no Uid line in /proc/1/status:\n{status}")
    return [int(u) for u in found.group(1).split()]


def start_and_check(env: dict[str, str]) -> None:
    name = f"dstl-image-test-{os.getpid()}"
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(
            run, ["podman", "rm", "--force", "--time", "0", name], env=env, check=False
        )
        with step("run: podman run"):
            run(
                [
                    *("podman", "run", "--detach", "--name", name, "--ulimit", "host"),
                    # the host's network namespace: the loopback listeners are reachable here
                    *("--network", "host"),
                    # as the chart runs it: read-only root, no capabilities, no new privileges
                    *("--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"),
                    *("--tmpfs", "/data:rw,mode=1777"),
                    IMAGE,
                    *("--listen", "127.0.0.1:0", "--metrics-port", "0"),
                    *("--storage", "file:///data/objects"),
                ],
                env=env,
            )
            ready = wait_ready(env, name)
        log(ready.line)
        answer = health(ready.grpc)
        log(f"health {ready.grpc}: {answer}")
        if answer != "SERVING":
            raise ImageTestError(f"health answered {answer}, expected SERVING")
        samples = metrics(ready.metrics_port)
        if not samples:
            raise ImageTestError("/metrics holds no dstl_ samples")
        log(f"/metrics on 127.0.0.1:{ready.metrics_port}: {len(samples)} dstl_ samples")
        uids = process_uids(env, name)
        log(f"PID 1 uids (real, effective, saved, fs): {uids}")
        if 0 in uids:
            raise ImageTestError(f"the sidecar runs as root: uids {uids}")
        version = run(["podman", "exec", name, "dstl-server", "--version"], env=env).stdout.strip()
        log(f"version: {version}")
        if version.split()[-1] != VERSION:
            raise ImageTestError(f"the image reports {version!r}, expected {VERSION}")
        with step("stop: SIGTERM"):
            run(["podman", "stop", "--time", "30", name], env=env)
        code = run(["podman", "inspect", "--format", "{{.State.ExitCode}}", name], env=env).stdout
        if code.strip() != "0":
            logs = run(["podman", "logs", name], env=env, check=False)
            raise ImageTestError(f"exit code {code.strip()} on SIGTERM:\n{logs.stderr[-3000:]}")
        log("stopped on SIGTERM, exit code 0")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--keep-image", action="store_true", help=f"keep {IMAGE} (removed by default)"
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    WORK.mkdir(parents=True, exist_ok=True)
    try:
        with step("tools"):
            ensure_tools()
        env = podman_env(WORK)
        base = ensure_base(env, WORK)
        python, libc = in_base(
            env,
            base,
            "import platform, sys; print('%d.%d' % sys.version_info[:2], platform.libc_ver()[1])",
        ).split()
        log(f"base Python {python}, glibc {libc}")
        with step("wheels: downloaded on the host"):
            context = make_context(WORK)
            wheelhouse = make_wheelhouse(WORK, context, python, libc, platform.machine())
        try:
            with step(f"build {IMAGE} (no network)"):
                build(env, base, context, wheelhouse)
            start_and_check(env)
        finally:
            if not args.keep_image:
                run(["podman", "rmi", "--force", IMAGE], env=env, check=False)
    except (ImageTestError, subprocess.TimeoutExpired) as exc:
        log(f"FAILED after {time.monotonic() - start:.0f} s: {exc}")
        return 1
    log(f"PASSED in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
