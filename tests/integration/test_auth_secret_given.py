"""A node secret that is given must be a valid one; "no auth" is only the absence of one.

A real ``dstl-server`` process, each way a secret can be given (the
``DSTL_AUTH_SECRET`` variable, ``--auth-secret-file``/``DSTL_AUTH_SECRET_FILE``,
and the previous secret of a rotation), each way it can come out empty
(an empty variable, an empty or whitespace-only file, an empty path): the
process refuses to start with exit code 2 and one line naming the setting,
on TCP loopback and on a Unix socket alike. Before, each of them started a
sidecar that trusted every caller. A sidecar given no secret at all runs
without auth (the documented default, loopback or Unix socket only) and says
so on its READY line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dstl_client import ChangelogClient
from dstl_client.core.errors import Unauthenticated
from dstl_server.testing import ServerProcess, stop_process

CONSOLE_SCRIPT = Path(sys.executable).with_name("dstl-server")
SECRET = "k7Qv2-node-secret-9fLx3mZp8RtYw4Hs6Jd1"


def run_server(
    tmp_path: Path, args: list[str], env: dict[str, str], *, unix: bool = False
) -> subprocess.CompletedProcess[str]:
    """``dstl-server`` that must exit by itself; one that wrongly starts is stopped as soon
    as it prints its READY line (its stdout then holds that line, which fails the test)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DSTL_")}
    where = (
        ["--listen", "", "--unix-socket", str(tmp_path / "dstl.sock")]
        if unix
        else ["--listen", "127.0.0.1:0"]
    )
    argv = [
        str(CONSOLE_SCRIPT),
        *where,
        *("--metrics-port", "-1", "--storage", f"file://{tmp_path / 'objects'}"),
        *args,
    ]
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err, text=True, env={**clean, **env}
        )
        try:
            first: list[str] = []
            reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()))  # type: ignore[union-attr]
            reader.start()
            reader.join(30)  # the READY line, or end of file when the process exits
        finally:
            stop_process(proc, 5)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, "".join(first), err.read())


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# (id, flags, environment, what the one line must name); {empty}/{blank} are files
CASES = [
    ("env-empty", [], {"DSTL_AUTH_SECRET": ""}, ("DSTL_AUTH_SECRET", "empty")),
    ("env-blank", [], {"DSTL_AUTH_SECRET": " \t "}, ("DSTL_AUTH_SECRET", "empty")),
    ("file-empty", ["--auth-secret-file", "{empty}"], {}, ("auth_secret_file", "empty")),
    ("file-blank", ["--auth-secret-file", "{blank}"], {}, ("auth_secret_file", "empty")),
    ("env-file-empty", [], {"DSTL_AUTH_SECRET_FILE": "{empty}"}, ("auth_secret_file", "empty")),
    ("file-no-path", ["--auth-secret-file", ""], {}, ("auth_secret_file", "names no file")),
    ("env-no-path", [], {"DSTL_AUTH_SECRET_FILE": ""}, ("auth_secret_file", "names no file")),
    (
        "previous-env-empty",
        [],
        {
            "DSTL_AUTH_SECRET": SECRET,
            "DSTL_AUTH_PREVIOUS_SECRET": "",
            "DSTL_AUTH_PREVIOUS_SECRET_UNTIL": "2099-01-01T00:00:00Z",
        },
        ("DSTL_AUTH_PREVIOUS_SECRET", "empty"),
    ),
    (
        "previous-file-blank",
        [
            "--auth-previous-secret-file",
            "{blank}",
            "--auth-previous-secret-until",
            "2099-01-01T00:00:00Z",
        ],
        {"DSTL_AUTH_SECRET": SECRET},
        ("auth_previous_secret_file", "empty"),
    ),
]


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
@pytest.mark.parametrize(
    ("args", "env", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_an_empty_given_secret_refuses_to_start(
    tmp_path: Path, args: list[str], env: dict[str, str], names: tuple[str, ...], unix: bool
) -> None:
    files = {
        "{empty}": _file(tmp_path, "empty", ""),
        "{blank}": _file(tmp_path, "blank", " \n\t\n"),
    }
    res = run_server(
        tmp_path,
        [files.get(a, a) for a in args],
        {k: files.get(v, v) for k, v in env.items()},
        unix=unix,
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stdout == ""  # never READY
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("dstl-server: configuration error: "), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert SECRET not in lines[0]
    assert not (tmp_path / "objects").exists()  # nothing started


def test_an_empty_parent_token_file_refuses_to_start(tmp_path: Path) -> None:
    """A forwarding node given an empty token file used to forward with no token at all."""
    blank = _file(tmp_path, "blank", " \n")
    res = run_server(tmp_path, ["--parent", "127.0.0.1:9", "--parent-token-file", blank], {})
    assert res.returncode == 2 and res.stdout == "", (res.stdout, res.stderr)
    assert res.stderr.splitlines() == [
        f"dstl-server: configuration error: setting parent_token_file={blank!r}: the file is empty"
    ]


def test_a_weak_secret_from_a_file_refuses_to_start(tmp_path: Path) -> None:
    res = run_server(tmp_path, ["--auth-secret-file", _file(tmp_path, "s", "short\n")], {})
    assert res.returncode == 2 and res.stdout == ""
    assert "auth_secret: too weak (need at least 32 characters" in res.stderr
    assert "short" not in res.stderr  # never the secret itself


def test_printing_a_token_with_an_empty_secret_is_refused(tmp_path: Path) -> None:
    res = run_server(
        tmp_path, ["--auth-secret-file", _file(tmp_path, "e", "\n"), "--print-token", "j"], {}
    )
    assert res.returncode == 2 and res.stdout == ""  # no token of an empty key printed
    assert "auth_secret_file" in res.stderr and "empty" in res.stderr


def test_no_secret_at_all_is_no_auth_and_says_so(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "off") as proc:
        assert proc.ready_fields["auth"] == "off"
        with ChangelogClient(proc.address, timeout_s=10) as client:
            assert list(client.list_objects("job-a")) == []
    with ServerProcess(tmp_path / "on", env={"DSTL_AUTH_SECRET": SECRET}) as proc:
        assert proc.ready_fields["auth"] == "on"
        with ChangelogClient(proc.address, timeout_s=10) as client, pytest.raises(Unauthenticated):
            list(client.list_objects("job-a"))
