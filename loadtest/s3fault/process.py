"""The fault proxy as a child process (:class:`FaultProxyProcess`), driven over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Mapping
from typing import Any

from dstl_server.testing import stop_process
from loadtest.s3fault.config import FaultConfig


class FaultProxyProcess:
    """The proxy as a child process (``python -m loadtest.s3fault``), driven over HTTP.

    ``with FaultProxyProcess(upstream) as proxy:`` starts it and waits for
    its ``READY`` line; :attr:`url` is the endpoint for S3 clients.
    :meth:`set_faults`, :meth:`faults`, :meth:`stats` and
    :meth:`reset_stats` talk to its control endpoints. Leaving the block
    always stops the process (SIGTERM, then SIGKILL).

    The initial faults are validated here, before the child starts. Not
    thread-safe: start and stop it from one thread; the control calls are
    plain blocking HTTP requests and may come from any thread while it runs.
    """

    def __init__(
        self,
        upstream: str,
        *,
        faults: FaultConfig | Mapping[str, Any] | None = None,
        seed: int | None = None,
        listen: str = "127.0.0.1:0",
        start_timeout_s: float = 20.0,
    ) -> None:
        self.upstream = upstream
        self.listen = listen
        self.seed = seed
        self.start_timeout_s = start_timeout_s
        initial = faults.to_dict() if isinstance(faults, FaultConfig) else dict(faults or {})
        FaultConfig.from_dict(initial)  # fail here, not in the child
        self._initial = initial
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self._stderr: Any = None

    def start(self) -> FaultProxyProcess:
        args = [
            sys.executable,
            "-m",
            "loadtest.s3fault",
            "--listen",
            self.listen,
            "--upstream",
            self.upstream,
            "--faults",
            json.dumps(self._initial),
        ]
        if self.seed is not None:
            args += ["--seed", str(self.seed)]
        # stderr goes to a file: a pipe nobody reads would stall a chatty proxy
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        line: list[str] = []

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            line.append(self.proc.stdout.readline())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if not line or not line[0].startswith("READY "):
            self._stderr.seek(0)
            err = self._stderr.read()[-2000:]
            self.stop()
            raise RuntimeError(f"fault proxy did not start: {err}")
        self.url = dict(p.split("=", 1) for p in line[0].split()[1:])["url"]
        return self

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def set_faults(self, faults: FaultConfig | Mapping[str, Any]) -> dict[str, Any]:
        """Replace the faults in force; returns them as the proxy now holds them."""
        raw = faults.to_dict() if isinstance(faults, FaultConfig) else dict(faults)
        FaultConfig.from_dict(raw)
        result: dict[str, Any] = self._call("POST", "/__fault__", raw)
        return result

    def faults(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/__fault__")
        return result

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/__stats__")
        return result

    def reset_stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/__stats__/reset", {})
        return result

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 10 s) and reap; idempotent."""
        stop_process(self.proc, 10.0)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> FaultProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
