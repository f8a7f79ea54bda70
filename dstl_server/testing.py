"""Helpers for users' own tests: a real sidecar in-process or as a process.

::

    from dstl_server.testing import running_server, ServerProcess

    async with running_server(tmp_path) as server:          # in-process, free port
        client = ChangelogClient(server.address)

    with ServerProcess(tmp_path) as proc:                    # a real dstl-server process
        client = ChangelogClient(proc.address)

Both bind to 127.0.0.1 on a free port (or a Unix socket), store objects under
the given directory, and stop the server when the block exits, even on error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from dstl_server.app import DstlServer
from dstl_server.settings import ServerSettings


def test_settings(root: str | Path, **overrides: Any) -> ServerSettings:
    """Settings for tests: loopback on a free port, file:// under ``root``, no fsync."""
    values: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "storage": f"file://{Path(root).resolve() / 'objects'}",
        "metrics_port": 0,
        "fsync": False,
        "shutdown_grace_s": 5.0,
    }
    values.update(overrides)
    return ServerSettings(**values)


def scrape_metrics(port: int, host: str = "127.0.0.1", timeout_s: float = 5.0) -> dict[str, float]:
    """Every sample of a sidecar's ``/metrics`` endpoint, keyed like the exposition.

    Unlabelled samples are keyed by name (``dstl_appended_bytes_total``),
    labelled ones by name and sorted labels (``dstl_uploads_total{result="ok"}``).
    """
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


@asynccontextmanager
async def running_server(root: str | Path, **overrides: Any) -> AsyncIterator[DstlServer]:
    """An in-process sidecar on the running event loop."""
    server = DstlServer(test_settings(root, **overrides))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class ServerProcess:
    """A ``dstl-server`` child process; ``address`` once started.

    ``kill()`` sends SIGKILL (a crash); ``stop()`` SIGTERM (clean shutdown).
    Leaving the ``with`` block always reaps the process.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        start_timeout_s: float = 30.0,
        listen: str = "127.0.0.1:0",
        unix_socket: str | None = None,
        storage: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.storage = storage or f"file://{self.root.resolve() / 'objects'}"
        self.args = [
            sys.executable,
            "-m",
            "dstl_server",
            "--listen",
            listen,
            "--storage",
            self.storage,
            "--metrics-port",
            "0",
            *(["--unix-socket", unix_socket] if unix_socket else []),
            *extra_args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.metrics_port = 0
        self.epoch = ""
        #: whether the store answered the start probe (``store=`` of the READY line)
        self.store_up = False
        #: every ``key=value`` of the READY line (``auth`` is ``on`` or ``off``)
        self.ready_fields: dict[str, str] = {}
        self.stderr_path = self.root / "server.stderr"
        self._stderr: Any = None

    def start(self) -> ServerProcess:
        self._stderr = open(self.stderr_path, "a")  # noqa: SIM115 - closed in _reap
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=self.env
        )
        line: list[str] = []

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            line.append(self.proc.stdout.readline())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(self.start_timeout_s)
        if not line or not line[0].startswith("READY"):
            self.kill()
            raise RuntimeError(f"dstl-server did not start: {self.stderr_path.read_text()[-2000:]}")
        fields = dict(part.split("=", 1) for part in line[0].split()[1:])
        self.address = fields["grpc"]
        self.metrics_port = int(fields["metrics_port"]) if fields["metrics_port"] != "None" else 0
        self.epoch = fields["epoch"]
        self.store_up = fields.get("store") == "up"
        self.ready_fields = fields
        return self

    def scrape_metrics(self) -> dict[str, float]:
        """The process's metrics (see :func:`scrape_metrics`); needs the metrics port."""
        if not self.metrics_port:
            raise RuntimeError("the metrics endpoint is disabled")
        return scrape_metrics(self.metrics_port)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code."""
        try:
            return stop_process(self.proc, timeout_s, force=False)
        finally:
            self._close_stderr()

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed."""
        stop_process(self.proc, 0)
        self._close_stderr()

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        stop_process(self.proc, 10.0)
        self._close_stderr()


def stop_process(
    proc: subprocess.Popen[Any] | None, term_timeout_s: float, *, force: bool = True
) -> int:
    """Stop a child process and reap it; returns its exit code. Idempotent.

    SIGTERM, then wait ``term_timeout_s`` (0: SIGKILL at once); if it is
    still running then, SIGKILL. With ``force=False`` that case also raises
    ``TimeoutExpired`` (after the kill), so a caller testing clean shutdown
    sees it. Closes its stdout pipe.
    """
    if proc is None:
        return 0
    try:
        if proc.poll() is None:
            if term_timeout_s > 0:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(term_timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                    if not force:
                        raise
            if proc.poll() is None:
                proc.kill()
        return proc.wait(10)
    finally:
        if proc.stdout is not None and proc.poll() is not None:
            proc.stdout.close()
