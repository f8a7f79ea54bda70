"""Token expiry and node-secret rotation: the authenticator with an injected clock, and the
settings that configure a rotation.

* An expiring token (``dstl1.exp.<unix>...``) is valid before its second and
  UNAUTHENTICATED ("token expired at ...") from it on; its expiry is covered
  by the mac, so it cannot be moved, removed or added without the secret.
  Tokens without expiry stay valid (the format of before).
* With a previous secret, its tokens are valid until the deadline and refused
  after it with a message that says so; the current secret's always; tokens
  are minted from the current secret only.
* The settings refuse a rotation that is half configured.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dstl_client.core.errors import ConfigError, Unauthenticated
from dstl_server.auth import ADMIN, NODE, Authenticator, Principal, expiry_after
from dstl_server.settings import ServerSettings
from tests.fakes import ManualClock

OLD = "0123456789abcdef-the-previous-node-secret"
NEW = "fedcba9876543210-the-current-node-secret"
THIRD = "a-third-secret-0123456789-nobody-holds-it"
T0 = 1_900_000_000.0  # 2030-03-17


# ---------------------------------------------------------------- expiry


def test_an_expiring_token_is_valid_until_its_second() -> None:
    clock = ManualClock(T0)
    auth = Authenticator(NEW, clock=clock)
    token = auth.job_token("job-a", expires_at=int(T0) + 60)
    assert token.startswith(f"dstl1.exp.{int(T0) + 60}.job.job-a.")
    assert auth.principal(token) == Principal("job-a")
    clock.now = T0 + 59.999
    assert auth.principal(token) == Principal("job-a")
    clock.now = T0 + 60
    with pytest.raises(Unauthenticated, match=r"token expired at 2030-03-17T\S+Z") as info:
        auth.principal(token)
    assert info.value.grpc_code == "UNAUTHENTICATED"
    assert "--ttl" in info.value.message  # says how to get a fresh one
    fresh = auth.job_token("job-a", expires_at=int(clock.now) + 60)
    assert auth.principal(fresh) == Principal("job-a")


def test_every_kind_of_token_may_expire() -> None:
    clock = ManualClock(T0)
    auth = Authenticator(NEW, clock=clock)
    exp = int(T0) + 1
    assert auth.principal(auth.admin_token(expires_at=exp)) is ADMIN
    assert auth.principal(auth.node_token(expires_at=exp)) is NODE
    clock.now = T0 + 1
    for token in (auth.admin_token(expires_at=exp), auth.node_token(expires_at=exp)):
        with pytest.raises(Unauthenticated, match="expired"):
            auth.principal(token)


def test_tokens_without_expiry_never_expire() -> None:
    clock = ManualClock(T0)
    auth = Authenticator(NEW, clock=clock)
    token = auth.job_token("job-a")
    assert token.startswith("dstl1.job.job-a.")  # the format of before
    clock.now = 10**11
    assert auth.principal(token) == Principal("job-a")


def test_the_expiry_is_covered_by_the_mac() -> None:
    clock = ManualClock(T0)
    auth = Authenticator(NEW, clock=clock)
    exp = int(T0) + 60
    token = auth.job_token("job-a", expires_at=exp)
    mac = token.rpartition(".")[2]
    forged = [
        f"dstl1.exp.{exp + 3600}.job.job-a.{mac}",  # moved later
        f"dstl1.job.job-a.{mac}",  # removed
        f"dstl1.exp.{exp}.job.job-b.{mac}",  # another job, same expiry
        f"dstl1.exp.{exp}.admin.{mac}",  # another kind
    ]
    unexpiring_mac = auth.job_token("job-a").rpartition(".")[2]
    forged.append(f"dstl1.exp.{exp}.job.job-a.{unexpiring_mac}")  # added to an unexpiring mac
    for bad in forged:
        with pytest.raises(Unauthenticated, match="wrong token"):
            auth.principal(bad)
    clock.now = exp + 1  # a forged expiry is refused as forged, not as expired
    with pytest.raises(Unauthenticated, match="wrong token"):
        auth.principal(f"dstl1.exp.{exp - 10}.job.job-a.{mac}")


@pytest.mark.parametrize(
    "token",
    [
        "dstl1.exp.",
        "dstl1.exp..job.a.mac",
        "dstl1.exp.0.admin.mac",
        "dstl1.exp.-5.admin.mac",
        "dstl1.exp.+5.admin.mac",
        "dstl1.exp.0x10.admin.mac",
        "dstl1.exp.1234567890123.admin.mac",  # 13 digits
        "dstl1.exp.1e9.admin.mac",
        "dstl1.exp.١٢٣.admin.mac",  # non-ASCII digits
        "dstl1.exp.123.exp.123.admin.mac",
        "dstl1.exp.123.admin",
        "dstl1.exp.123.job..mac",
    ],
)
def test_malformed_expiries(token: str) -> None:
    with pytest.raises(Unauthenticated) as info:
        Authenticator(NEW).principal(token)
    assert "malformed" in info.value.message or "wrong token" in info.value.message


def test_minting_refuses_a_bad_expiry() -> None:
    auth = Authenticator(NEW)
    for bad in (0, -1, 10**12):
        with pytest.raises(ConfigError, match="expiry"):
            auth.job_token("job-a", expires_at=bad)


def test_expiry_after_rounds_up_and_refuses_nonsense() -> None:
    assert expiry_after(60, ManualClock(T0 + 0.25)) == int(T0) + 61
    assert expiry_after(0.5, ManualClock(T0)) == int(T0) + 1
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="ttl"):
            expiry_after(bad, ManualClock(T0))


def test_an_empty_secret_derives_no_tokens() -> None:
    for empty in ("", "  \n"):
        with pytest.raises(ConfigError, match="empty"):
            Authenticator(empty)


# ---------------------------------------------------------------- rotation


def test_tokens_of_the_previous_secret_work_until_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(T0)
    auth = Authenticator(NEW, previous_secret=OLD, previous_until=T0 + 3600, clock=clock)
    old = Authenticator(OLD)
    old_tokens = {
        "job": (old.job_token("job-a"), Principal("job-a")),
        "admin": (old.admin_token(), ADMIN),
        "node": (old.node_token(), NODE),
        "expiring": (old.job_token("job-b", expires_at=int(T0) + 7200), Principal("job-b")),
    }
    with caplog.at_level(logging.WARNING, logger="dstl_server.auth"):
        for token, who in old_tokens.values():
            assert auth.principal(token) == who
            assert auth.principal(token) == who
    assert auth.previous_secret_uses == 8
    # one warning per caller, naming it, so the operator sees who still needs a new token
    warned = [r.getMessage() for r in caplog.records if "previous node secret" in r.getMessage()]
    assert len(warned) == 4 and any("job job-a" in m for m in warned)
    # new tokens are minted from the current secret, and work
    assert auth.job_token("job-a") == Authenticator(NEW).job_token("job-a")
    assert auth.principal(auth.job_token("job-a")) == Principal("job-a")
    clock.now = T0 + 3600
    for token, _who in old_tokens.values():
        with pytest.raises(Unauthenticated, match="previous node secret, accepted only until"):
            auth.principal(token)
    assert auth.principal(auth.job_token("job-a")) == Principal("job-a")


def test_a_token_of_another_secret_is_refused_during_the_rotation() -> None:
    auth = Authenticator(NEW, previous_secret=OLD, previous_until=T0 + 3600, clock=ManualClock(T0))
    with pytest.raises(Unauthenticated, match="wrong token"):
        auth.principal(Authenticator(THIRD).job_token("job-a"))
    assert auth.previous_secret_uses == 0


def test_an_expired_token_of_the_previous_secret_is_expired() -> None:
    clock = ManualClock(T0)
    auth = Authenticator(NEW, previous_secret=OLD, previous_until=T0 + 3600, clock=clock)
    token = Authenticator(OLD).job_token("job-a", expires_at=int(T0) + 10)
    assert auth.principal(token) == Principal("job-a")
    clock.now = T0 + 10
    with pytest.raises(Unauthenticated, match="expired"):
        auth.principal(token)


def test_a_previous_secret_needs_a_deadline() -> None:
    with pytest.raises(ConfigError, match="auth_previous_secret_until"):
        Authenticator(NEW, previous_secret=OLD)


# ---------------------------------------------------------------- settings


def test_rotation_settings(tmp_path: Path) -> None:
    old_file = tmp_path / "old"
    old_file.write_text(OLD + "\n")
    s = ServerSettings.from_sources(
        {
            "auth_previous_secret_file": str(old_file),
            "auth_previous_secret_until": "2030-03-17T12:00:00+01:00",
        },
        environ={"DSTL_AUTH_SECRET": NEW},
    )
    assert s.auth_previous_secret == OLD
    assert s.auth_previous_deadline == datetime(2030, 3, 17, 11, tzinfo=UTC).timestamp()
    auth = Authenticator.from_settings(s)
    assert auth is not None and auth.previous_until == s.auth_previous_deadline
    assert ServerSettings(auth_secret=NEW).auth_previous_deadline is None
    assert Authenticator.from_settings(ServerSettings()) is None


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"auth_previous_secret": OLD, "auth_previous_secret_until": "2030-01-01T00:00:00Z"}, "needs the current one"),
        ({"auth_secret": NEW, "auth_previous_secret": OLD}, "needs auth_previous_secret_until"),
        ({"auth_secret": NEW, "auth_previous_secret_until": "2030-01-01T00:00:00Z"}, "needs a previous secret"),
        ({"auth_secret": NEW, "auth_previous_secret": NEW, "auth_previous_secret_until": "2030-01-01T00:00:00Z"}, "the same as auth_secret"),
        ({"auth_secret": NEW, "auth_previous_secret": " " + NEW + "\n", "auth_previous_secret_until": "2030-01-01T00:00:00Z"}, "the same as auth_secret"),
        ({"auth_secret": NEW, "auth_previous_secret": "short", "auth_previous_secret_until": "2030-01-01T00:00:00Z"}, "auth_previous_secret: too weak"),
        ({"auth_secret": NEW, "auth_previous_secret": OLD, "auth_previous_secret_until": "2030-01-01T00:00:00"}, "UTC offset"),
        ({"auth_secret": NEW, "auth_previous_secret": OLD, "auth_previous_secret_until": "tomorrow"}, "ISO 8601"),
    ],
)  # fmt: skip
def test_half_configured_rotations_are_refused(values: dict[str, Any], why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        ServerSettings(**values)
    assert OLD not in info.value.message and NEW not in info.value.message


def test_the_previous_secret_is_environment_only_and_masked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dstl_server import cli

    flags = {o for a in cli.build_parser()._actions for o in a.option_strings}
    assert "--auth-previous-secret" not in flags
    assert {"--auth-previous-secret-file", "--auth-previous-secret-until"} <= flags
    monkeypatch.setenv("DSTL_AUTH_SECRET", NEW)
    monkeypatch.setenv("DSTL_AUTH_PREVIOUS_SECRET", OLD)
    monkeypatch.setenv("DSTL_AUTH_PREVIOUS_SECRET_UNTIL", "2030-01-01T00:00:00Z")
    code = cli.main(["--storage", f"file://{tmp_path}/o", "--print-config"])
    out = capsys.readouterr().out
    assert code == 0
    assert OLD not in out and "auth_previous_secret = '***'" in out
