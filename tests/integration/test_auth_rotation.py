"""Rotating the node secret and expiring tokens, end to end against real ``dstl-server``
processes, following the procedure of docs/deploy.md ("Rotating the node secret").

1. The node runs on the old secret; a job holds a token minted from it
   (``dstl-server --print-token``) and persists changes.
2. The node restarts with the new secret and the old one as the previous
   secret, with a deadline: the job's old token keeps working (it reads what
   it wrote and writes more), and a token minted now (from the new secret)
   works too.
3. Past the deadline (a restart with a deadline already passed; the passing
   of time itself is tested with an injected clock in
   ``tests/dstl_server/test_auth_rotation.py``) the old token is refused with
   a message that says why; the new one reads everything written under both.
4. The previous secret removed: only the new token works.

Tokens minted with ``--ttl`` carry their expiry; one whose expiry has passed
is refused by the server (UNAUTHENTICATED, "expired").
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dstl_client import ChangelogClient, ChangelogHandle
from dstl_client.core.errors import Unauthenticated
from dstl_server.auth import Authenticator
from dstl_server.cli import main
from dstl_server.testing import ServerProcess

OLD = "k7Qv2-old-node-secret-9fLx3mZp8RtYw4Hs6Jd1"
NEW = "Z9pL4-new-node-secret-2aBc7dEf5GhJk8MnQr3"
JOB = "clicks"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dstl_server", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def mint(secret_file: Path, *args: str) -> str:
    """A token minted the way an operator does: the CLI, from the secret file."""
    res = cli("--auth-secret-file", str(secret_file), *args)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def until(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def write(client: ChangelogClient, operator: str, data: bytes) -> ChangelogHandle:
    w = client.create_writer(job_id=JOB, operator_id=operator, key_group_range=(0, 1))
    try:
        w.append(0, data)
        return w.persist_durably(after=0).result(timeout=30)
    finally:
        w.close()


def read(client: ChangelogClient, handle: ChangelogHandle) -> list[bytes]:
    return [data for _kg, _sqn, data in client.read_changes(handle)]


@pytest.mark.slow
def test_rotating_the_node_secret(tmp_path: Path) -> None:
    old_file, new_file = tmp_path / "old", tmp_path / "new"
    old_file.write_text(OLD + "\n")
    new_file.write_text(NEW + "\n")
    root = tmp_path / "node"  # the same store across the restarts
    old_token = mint(old_file, "--print-token", JOB)

    # 1. the old secret
    with (
        ServerProcess(root, extra_args=["--auth-secret-file", str(old_file)]) as proc,
        ChangelogClient(proc.address, token=old_token, timeout_s=20) as job,
    ):
        before = write(job, "op-1", b"before the rotation")

    # 2. the new secret, the old one accepted until a deadline
    rotating = [
        *("--auth-secret-file", str(new_file)),
        *("--auth-previous-secret-file", str(old_file)),
        *("--auth-previous-secret-until", until(timedelta(hours=1))),
    ]
    new_token = mint(new_file, "--print-token", JOB)
    assert new_token != old_token
    with ServerProcess(root, extra_args=rotating) as proc:
        with ChangelogClient(proc.address, token=old_token, timeout_s=20) as job:
            assert read(job, before) == [b"before the rotation"]
            during = write(job, "op-2", b"during the rotation, old token")
        uses = proc.scrape_metrics()["dstl_auth_previous_secret_uses_total"]
        assert uses > 0  # the calls of the old token, counted
        with ChangelogClient(proc.address, token=new_token, timeout_s=20) as job:
            assert read(job, during) == [b"during the rotation, old token"]
            after = write(job, "op-3", b"during the rotation, new token")
        # the new token's calls are not (the rotation is done when it stops growing)
        assert proc.scrape_metrics()["dstl_auth_previous_secret_uses_total"] == uses
        # the node logs which callers still use the previous secret
        assert f"job {JOB} authenticated with the previous node secret" in (
            proc.stderr_path.read_text()
        )

    # 3. past the deadline
    past = [*rotating[:-1], until(-timedelta(seconds=1))]
    with ServerProcess(root, extra_args=past) as proc:
        with (
            ChangelogClient(proc.address, token=old_token, timeout_s=20) as job,
            pytest.raises(Unauthenticated, match="previous node secret, accepted only until"),
        ):
            read(job, before)
        with ChangelogClient(proc.address, token=new_token, timeout_s=20) as job:
            assert read(job, before) + read(job, during) + read(job, after) == [
                b"before the rotation",
                b"during the rotation, old token",
                b"during the rotation, new token",
            ]

    # 4. the previous secret removed
    with ServerProcess(root, extra_args=rotating[:2]) as proc:
        with (
            ChangelogClient(proc.address, token=old_token, timeout_s=20) as job,
            pytest.raises(Unauthenticated, match="wrong token"),
        ):
            read(job, before)
        with ChangelogClient(proc.address, token=new_token, timeout_s=20) as job:
            assert read(job, after) == [b"during the rotation, new token"]


def test_expiring_tokens_against_a_real_server(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(NEW + "\n")
    started = time.time()
    fresh = mint(secret_file, "--print-token", JOB, "--ttl", "12h")
    # the expiry the CLI wrote into the token: 12 hours from now, whole seconds
    expires = int(fresh.split(".")[2])
    assert fresh.startswith("dstl1.exp.") and started + 43200 <= expires <= time.time() + 43201
    admin = mint(secret_file, "--print-admin-token", "--ttl", "30m")
    # an expired one (minted with the library, which takes an expiry in the past)
    expired = Authenticator(NEW).job_token(JOB, expires_at=int(started) - 1)
    with ServerProcess(tmp_path / "node", extra_args=["--auth-secret-file", str(secret_file)]) as p:
        with ChangelogClient(p.address, token=fresh, timeout_s=20) as job:
            handle = write(job, "op", b"with a fresh token")
        with ChangelogClient(p.address, token=admin, timeout_s=20) as op:
            assert read(op, handle) == [b"with a fresh token"]
        with ChangelogClient(p.address, token=expired, timeout_s=20) as job:
            with pytest.raises(Unauthenticated, match="token expired at"):
                write(job, "op", b"never")
            with pytest.raises(Unauthenticated, match="token expired at"):
                read(job, handle)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--ttl", "1h"], "--ttl goes with --print-token"),
        (["--print-token", JOB, "--ttl", "0"], "expected a duration above 0"),
        (["--print-token", JOB, "--ttl", "-5"], "expected a duration above 0"),
        (["--print-token", JOB, "--ttl", "1w"], "expected a duration above 0"),
        (["--print-token", JOB, "--ttl", "101y"], "expected a duration above 0"),
        (["--print-token", JOB, "--ttl", "40000d"], "at most 100 years"),
    ],
)
def test_bad_ttl_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], why: str
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(NEW)
    code = main(
        ["--auth-secret-file", str(secret_file), "--storage", f"file://{tmp_path}/o", *args]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and why in err, err
