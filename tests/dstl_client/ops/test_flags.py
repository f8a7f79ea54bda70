"""``dstl``'s command line itself: ``--version``, no abbreviated flags, secrets never as
flags (``DSTL_TOKEN`` or ``--token-file`` reach a sidecar with auth), no ``pickle``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client.client import ChangelogClient
from dstl_client.core.version import package_version
from dstl_client.ops.cli import build_parser
from dstl_server.testing import ServerProcess
from tests.dstl_client.ops._helpers import Job, dstl

SECRET = "ops-cli-node-secret-0123456789abcdefXYZ"


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DSTL_REST_URL", "DSTL_CONFIG_TOKEN", "DSTL_TOKEN", "DSTL_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def every_parser(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``parser`` and every subparser under it, by their command words."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from every_parser(sub)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert dstl("--version").code == 0
    assert capsys.readouterr().out == f"dstl {package_version()}\n"


def test_no_parser_accepts_an_abbreviated_flag() -> None:
    parsers = dict(every_parser(build_parser()))
    assert {"dstl checkpoints list", "dstl state get", "dstl config set"} <= set(parsers)
    assert [name for name, p in parsers.items() if p.allow_abbrev] == []
    for argv, flag in (
        (["checkpoints", "list", "--check", "/data/ckpt"], "--check"),
        (["state", "get", "--key", "k", "--serial", "count=int64"], "--serial"),
        (["gc", "--dry", "--checkpoint-dir", "/data/ckpt"], "--dry"),
        (["config", "get", "--rest", "http://127.0.0.1:9", "--job-id", "j"], "--rest"),
        (["config", "get", "--config-token-f", "/x", "--job-id", "j"], "--config-token-f"),
    ):
        r = dstl(*argv)
        assert r.code == 2, (argv, r)
        assert f"unrecognized arguments: {flag} " in r.err and "never abbreviated" in r.err
        assert argv[argv.index(flag) + 1] not in r.err  # a value is never echoed


@pytest.mark.parametrize("spelling", [["--token", "s3cret-value"], ["--token=s3cret-value"]])
def test_a_token_flag_is_refused_with_the_way_out(spelling: list[str]) -> None:
    r = dstl("checkpoints", "list", *spelling, "--checkpoint-dir", "/nonexistent")
    assert r.code == 2 and len(r.err.splitlines()) == 1
    assert "--token was removed" in r.err and "ps" in r.err
    assert "DSTL_TOKEN" in r.err and "--token-file" in r.err
    assert "s3cret-value" not in r.err


@pytest.mark.parametrize("spec", ["pickle", "int64,pickle", "list:pickle", "map:str:pickle"])
def test_state_get_does_not_offer_pickle(spec: str) -> None:
    r = dstl(
        "state", "get", "--key", "k", "--serializer", f"count={spec}", "--checkpoint-dir", "/x"
    )
    assert r.code == 2 and "'pickle' is not offered" in r.err and "runs" in r.err, r.err
    assert "--serializers MODULE:ATTR" in r.err
    state_get = dict(every_parser(build_parser()))["dstl state get"]
    assert "pickle is not offered" in " ".join(state_get.format_help().split())


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    """A sidecar with a node secret (every call needs a token) and its admin token."""
    root = tmp_path_factory.mktemp("guarded")
    secret_file = root / "secret"
    secret_file.write_text(SECRET)
    mint = ["--auth-secret-file", str(secret_file), "--print-admin-token"]
    admin = subprocess.run(
        [sys.executable, "-m", "dstl_server", *mint],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    with ServerProcess(root / "srv", extra_args=["--auth-secret-file", str(secret_file)]) as proc:
        assert proc.ready_fields.get("auth") == "on"
        yield proc, admin


def test_the_sidecar_token_comes_from_the_environment_or_a_file(
    tmp_path: Path,
    sidecar: ServerProcess,
    guarded: tuple[ServerProcess, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, admin = guarded
    job = Job(tmp_path, sidecar.address, "ops-token")
    with ChangelogClient(sidecar.address) as client:
        client.wait_ready()
        job.run(client, range(1), materialize_at=())
    gc = ["gc", "--dry-run", "--checkpoint-dir", str(job.checkpoint_dir), "--address"]
    refused = dstl(*gc, proc.address)
    assert refused.code == 1 and "token" in refused.err.lower(), refused.err
    monkeypatch.setenv("DSTL_TOKEN", admin)
    r = dstl(*gc, proc.address)
    assert r.code == 0, r.err
    assert "0 objects listed" in r.out  # this sidecar's store holds none of the job's
    monkeypatch.setenv("DSTL_TOKEN", "not-a-token")  # the file wins over the variable
    token_file = tmp_path / "token"
    token_file.write_text(admin + "\n")
    r = dstl(*gc, proc.address, "--token-file", str(token_file))
    assert r.code == 0, r.err
    monkeypatch.delenv("DSTL_TOKEN")
    missing = dstl(*gc, proc.address, "--token-file", str(tmp_path / "none"))
    assert missing.code == 2 and "--token-file" in missing.err and "cannot read" in missing.err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_is_a_positive_number_of_seconds(value: str) -> None:
    for argv in (
        ["config", "get", "--rest-url", "http://127.0.0.1:9", "--job-id", "j"],
        ["checkpoints", "list", "--checkpoint-dir", "/x"],
    ):
        r = dstl(*argv, "--timeout-s", value)
        assert r.code == 2 and "--timeout-s" in r.err and "more than 0" in r.err, r.err
