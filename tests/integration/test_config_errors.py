"""A real ``dstl-server`` process fails early and clearly on a bad configuration.

* Every malformed or out-of-range flag or ``DSTL_*`` value exits with code 2
  and exactly one line on stderr that names the option (flag, variable or
  setting) and the problem; no traceback, nothing started, nothing created.
* Sizes take units (``2KiB``) through flags and variables.
* An unknown ``DSTL_*`` variable is one structured warning naming it and the
  closest known name; a variable the client reads (``DSTL_ADDRESS``) is not.
* ``--version`` prints the package version.
* A ``file://`` directory that cannot be created is a configuration error.

The store checks against a real S3 server (missing bucket, refused
credentials, unreachable endpoint) are in ``test_store_health.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from dstl_client import ChangelogClient
from dstl_client.core.errors import ChangeTooLarge
from dstl_server.testing import ServerProcess

CONSOLE_SCRIPT = Path(sys.executable).with_name("dstl-server")


def run_server(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``dstl-server`` on a free port with objects under ``tmp_path``; it must exit by itself
    (a configuration that wrongly passed would serve until the timeout)."""
    env = env or {}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DSTL_")}
    storage = [] if "DSTL_STORAGE" in env else ["--storage", f"file://{tmp_path / 'objects'}"]
    return subprocess.run(
        [str(CONSOLE_SCRIPT), "--listen", "127.0.0.1:0", "--metrics-port", "-1", *storage, *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean, **env},
    )


def assert_one_line_config_error(
    res: subprocess.CompletedProcess[str], *names: str, tmp_path: Path
) -> str:
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("dstl-server: configuration error: "), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert res.stdout == ""  # no READY
    assert not (tmp_path / "objects").exists()  # nothing started, nothing created
    return lines[0]


# (flag arguments, environment, what the one line must name)
BAD: list[tuple[list[str], dict[str, str], tuple[str, ...]]] = [
    # storage URLs
    (["--storage", "s3://"], {}, ("storage", "s3://bucket", "--storage")),
    (["--storage", "s3:///prefix"], {}, ("storage", "s3://bucket")),
    (["--storage", "file://relative/dir"], {}, ("storage", "absolute path")),
    (["--storage", "gs://bucket/x"], {}, ("storage", "file:///path or s3://")),
    (["--storage", "/var/tmp/dstl"], {}, ("storage",)),
    ([], {"DSTL_STORAGE": "s3://"}, ("storage", "DSTL_STORAGE")),
    # negative or zero where not allowed
    (["--max-writers", "-3"], {}, ("max_writers", "must be > 0", "--max-writers")),
    (["--upload-timeout-s", "0"], {}, ("upload_timeout_s", "must be > 0")),
    ([], {"DSTL_BATCH_SIZE_THRESHOLD": "0"}, ("batch_size_threshold", "DSTL_BATCH_SIZE_THRESHOLD")),
    (["--store-probe-interval-s", "0"], {}, ("store_probe_interval_s",)),
    # NaN and infinities
    (["--persist-delay-ms", "nan"], {}, ("--persist-delay-ms='nan'", "finite")),
    (["--hedge-quantile", "NaN"], {}, ("--hedge-quantile", "finite")),
    (["--upload-deadline-s", "inf"], {}, ("--upload-deadline-s", "finite")),
    ([], {"DSTL_SHUTDOWN_GRACE_S": "-inf"}, ("DSTL_SHUTDOWN_GRACE_S", "finite")),
    # not numbers
    (["--max-writers", "many"], {}, ("--max-writers='many'", "an integer")),
    (["--max-writers", "1.5"], {}, ("--max-writers", "an integer")),
    ([], {"DSTL_PERSIST_DELAY_MS": "soon"}, ("DSTL_PERSIST_DELAY_MS", "a number")),
    ([], {"DSTL_FSYNC": "maybe"}, ("DSTL_FSYNC", "true or false")),
    # bad sizes
    (["--max-change-bytes", "four"], {}, ("--max-change-bytes='four'", "a size")),
    (["--max-in-flight-bytes", "100M"], {}, ("--max-in-flight-bytes", "a size")),
    (["--max-in-flight-bytes", "-1"], {}, ("--max-in-flight-bytes", "a size")),
    ([], {"DSTL_MAX_CHANGE_BYTES": "0.1KiB"}, ("DSTL_MAX_CHANGE_BYTES", "a size")),
    ([], {"DSTL_MAX_CHANGE_BYTES": "64MiB"}, ("max_change_bytes", "max_request_bytes")),
    # other shapes of bad input
    (["--listen", "localhost"], {}, ("listen", "host:port")),
    (["--no-such-flag"], {}, ("unrecognized arguments: --no-such-flag",)),
    (["--listen"], {}, ("--listen", "expected one argument")),
]


@pytest.mark.parametrize(
    ("args", "env", "names"), BAD, ids=[" ".join(a) or str(e) for a, e, _ in BAD]
)
def test_bad_value_exits_2_with_one_line(
    args: list[str], env: dict[str, str], names: tuple[str, ...], tmp_path: Path
) -> None:
    res = run_server(tmp_path, *args, env=env)
    assert_one_line_config_error(res, *names, tmp_path=tmp_path)
    assert "Traceback" not in res.stderr


def test_storage_directory_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    res = run_server(tmp_path, "--storage", f"file://{blocker}/objects")
    line = assert_one_line_config_error(res, "storage", str(blocker), tmp_path=tmp_path)
    assert "cannot create the directory" in line


def test_version() -> None:
    res = subprocess.run(
        [str(CONSOLE_SCRIPT), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert res.stdout.strip() == f"dstl-server {version('dstl')}"
    assert res.stderr == ""


def _warnings(proc: ServerProcess) -> list[dict[str, str]]:
    out = []
    for line in proc.stderr_path.read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("level") == "warning" and "variable" in doc:
            out.append(doc)
    return out


def test_unknown_variable_is_one_structured_warning(tmp_path: Path) -> None:
    env = {
        "DSTL_PERSIST_DELAY": "5",  # misspelled: the setting is DSTL_PERSIST_DELAY_MS
        "DSTL_ADDRESS": "127.0.0.1:7070",  # read by the client: no warning
        "DSTL_MAX_CHANGE_BYTES": "2KiB",  # a size with a unit reaches the server
    }
    clean = {k: "" for k in os.environ if k.startswith("DSTL_") and k not in env}
    with ServerProcess(tmp_path / "srv", env={**clean, **env}) as proc:
        assert proc.store_up
        (warning,) = _warnings(proc)
        assert warning["variable"] == "DSTL_PERSIST_DELAY"
        assert warning["closest"] == "DSTL_PERSIST_DELAY_MS"
        assert "DSTL_PERSIST_DELAY_MS" in warning["msg"]
        with ChangelogClient(proc.address) as client:
            w = client.create_writer(job_id="units", operator_id="op", key_group_range=(0, 0))
            with pytest.raises(ChangeTooLarge, match="2048"):
                w.append(0, b"x" * 2049)
            w.append(0, b"x" * 2048)
            w.close()


def test_print_config_warns_about_unknown_variables(tmp_path: Path) -> None:
    res = run_server(tmp_path, "--print-config", env={"DSTL_MAX_INFLIGHT_BYTES": "1GiB"})
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        "dstl-server: warning: unknown environment variable DSTL_MAX_INFLIGHT_BYTES ignored "
        "(not a dstl setting; did you mean DSTL_MAX_IN_FLIGHT_BYTES?)"
    ]
    assert "max_in_flight_bytes = 104857600" in res.stdout.splitlines()  # the default
