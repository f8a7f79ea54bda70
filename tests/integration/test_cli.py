"""The ``dstl-server`` command line: flags, ``DSTL_*`` variables, config errors (and, with
``dstl``, no abbreviated flags in either CLI)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client import ChangelogClient
from dstl_server.cli import main
from dstl_server.settings import ServerSettings, env_name
from dstl_server.testing import ServerProcess

CONSOLE_SCRIPT = Path(sys.executable).with_name("dstl-server")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTL_")}
    env.update(extra)
    return env


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dstl_server", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(**env),
    )


def test_console_script_help_lists_every_setting() -> None:
    res = subprocess.run(
        [str(CONSOLE_SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    flags = set(re.findall(r"--[a-z0-9-]+", res.stdout))
    for name, env, *_ in ServerSettings.describe():
        flag = "--" + name.replace("_", "-")
        if ServerSettings.env_only(name):  # secrets: never a flag (it would show in ps)
            assert flag not in flags
        else:
            assert flag in flags
            assert env in res.stdout


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--persist-delay-ms", "-1"], {}, "persist_delay_ms"),
        (["--upload-max-attempts", "0"], {}, "upload_max_attempts"),
        (["--storage", "/var/tmp/dstl"], {}, "storage"),
        (["--listen", "localhost"], {}, "listen"),
        (["--listen", ""], {}, "listen"),
        (["--metrics-port", "70000"], {}, "metrics_port"),
        (["--tls-cert", "/nonexistent.pem"], {}, "tls_cert"),
        (["--hedge-mode", "sometimes"], {}, "hedge_mode"),
        (["--log-level", "CHATTY"], {}, "log_level"),
        (["--max-change-bytes", str(64 << 20)], {}, "max_change_bytes"),
        ([], {"DSTL_MAX_CHANGE_BYTES": "4M"}, "DSTL_MAX_CHANGE_BYTES"),
        ([], {"DSTL_FSYNC": "maybe"}, "DSTL_FSYNC"),
        ([], {"DSTL_PERSIST_DELAY_MS": "soon"}, "DSTL_PERSIST_DELAY_MS"),
        ([], {"DSTL_BATCH_SIZE_THRESHOLD": "0"}, "batch_size_threshold"),
        ([], {"DSTL_LISTEN": "0.0.0.0:7070"}, "listen"),
        ([], {"DSTL_LISTEN": ""}, "nothing to listen on"),
        (["--storage", "s3://"], {}, "storage"),
        (["--storage", "s3:///prefix"], {}, "storage"),
        (["--storage", "file://relative/dir"], {}, "storage"),
        (["--upload-timeout-s", "nan"], {}, "--upload-timeout-s"),
        (["--hedge-quantile", "nan"], {}, "--hedge-quantile"),
        ([], {"DSTL_PERSIST_DELAY_MS": "inf"}, "DSTL_PERSIST_DELAY_MS"),
        (["--metrics-host", "0.0.0.0"], {}, "metrics_host"),
        (["--metrics-host", "not an address"], {}, "metrics_host"),
        (["--max-writers-per-job", "0"], {}, "max_writers_per_job"),
        (["--writer-idle-timeout-s", "0"], {}, "writer_idle_timeout_s"),
        (["--auth-secret-file", "/nonexistent/secret"], {}, "auth_secret_file"),
    ],
)
def test_bad_config_exits_2_naming_the_setting(
    args: list[str],
    env: dict[str, str],
    names: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In-process (the same ``main`` the console script runs) to keep the suite quick;
    # the two tests below go through a real process.
    for key in [k for k in os.environ if k.startswith("DSTL_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # --print-config: a case that wrongly validated would print and return, not serve.
    code = main(["--storage", f"file://{tmp_path / 'objects'}", *args, "--print-config"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("dstl-server: configuration error:")
    assert names in err
    assert len(err.strip().splitlines()) == 1  # one clear line
    assert not (tmp_path / "objects").exists()  # nothing started, nothing created


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--persist-delay-ms", "-1"], {}, "persist_delay_ms"),
        ([], {"DSTL_MAX_CHANGE_BYTES": "4M"}, "DSTL_MAX_CHANGE_BYTES"),
        (["--storage", "s3://"], {}, "storage"),
        (["--storage", "file://relative/dir"], {}, "storage"),
    ],
)
def test_bad_config_process_exit_code(
    args: list[str], env: dict[str, str], names: str, tmp_path: Path
) -> None:
    res = run_cli("--storage", f"file://{tmp_path / 'objects'}", *args, **env)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "configuration error" in res.stderr and names in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "objects").exists()


def test_malformed_flag_value_is_one_line(tmp_path: Path) -> None:
    res = run_cli("--max-change-bytes", "four", "--print-config")
    assert res.returncode == 2
    assert res.stderr.startswith("dstl-server: configuration error: --max-change-bytes='four'")
    assert "expected a size" in res.stderr and len(res.stderr.splitlines()) == 1


def test_flag_wins_over_environment_which_wins_over_default() -> None:
    res = run_cli(
        "--persist-delay-ms",
        "7",
        "--print-config",
        DSTL_PERSIST_DELAY_MS="5",
        DSTL_MAX_CHANGE_BYTES="1234",
        DSTL_FSYNC="off",
    )
    assert res.returncode == 0, res.stderr
    lines = set(res.stdout.splitlines())
    assert "persist_delay_ms = 7.0" in lines
    assert "max_change_bytes = 1234" in lines
    assert "fsync = False" in lines
    assert f"max_writers = {ServerSettings().max_writers!r}" in lines
    assert env_name("max_writers") == "DSTL_MAX_WRITERS"


def test_unix_socket_only_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty DSTL_LISTEN turns TCP off, as ``--listen ''`` does."""
    sock = str(tmp_path / "d.sock")
    monkeypatch.setenv("DSTL_LISTEN", "")
    monkeypatch.setenv("DSTL_UNIX_SOCKET", sock)
    monkeypatch.setenv("DSTL_MAX_WRITERS", "")  # empty numbers still mean "not set"
    assert main(["--storage", f"file://{tmp_path}", "--print-config"]) == 0
    lines = set(capsys.readouterr().out.splitlines())
    assert {"listen = ''", f"unix_socket = {sock!r}"} <= lines
    assert f"max_writers = {ServerSettings().max_writers!r}" in lines


def test_settings_from_environment_reach_the_server(tmp_path: Path) -> None:
    with (
        ServerProcess(tmp_path / "srv", env={"DSTL_MAX_CHANGE_BYTES": "2048"}) as proc,
        ChangelogClient(proc.address) as client,
    ):
        w = client.create_writer(job_id="cli", operator_id="op", key_group_range=(0, 0))
        from dstl_client.core.errors import ChangeTooLarge

        with pytest.raises(ChangeTooLarge, match="2048"):
            w.append(0, b"x" * 2049)
        w.close()


@pytest.mark.slow
def test_address_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv") as proc:
        storage = f"file://{tmp_path / 'objects2'}"
        res = run_cli("--listen", proc.address, "--storage", storage, "--metrics-port", "-1")
        assert res.returncode == 1
        assert f"cannot listen on {proc.address}" in res.stderr
        assert "Traceback" not in res.stderr
        res = run_cli(
            "--listen",
            "127.0.0.1:0",
            "--storage",
            storage,
            "--metrics-port",
            str(proc.metrics_port),
        )
        assert res.returncode == 1
        assert f"cannot serve metrics on 127.0.0.1:{proc.metrics_port}" in res.stderr
        assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr


def _every_parser(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``parser`` and every subparser under it (a subparser reads its own flags)."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _every_parser(sub)


def test_neither_cli_accepts_an_abbreviated_flag() -> None:
    from dstl_client.ops.cli import build_parser as dstl_parser
    from dstl_server.cli import build_parser as server_parser

    for build in (server_parser, dstl_parser):
        parsers = dict(_every_parser(build()))
        assert [name for name, p in parsers.items() if p.allow_abbrev] == []
    # "--print-conf" would be "--print-config", "--check" "--checkpoint-dir"
    res = run_cli("--print-conf")
    assert res.returncode == 2 and "unrecognized arguments: --print-conf" in res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "dstl_client.ops.cli", "checkpoints", "list", "--check", "/x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(),
    )
    assert res.returncode == 2 and "unrecognized arguments: --check" in res.stderr
    assert "/x" not in res.stderr and len(res.stderr.splitlines()) == 1
