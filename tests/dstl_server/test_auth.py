"""Per-job credentials: tokens derived from the node secret, and which job they may act for."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import pytest

from dstl_client.core.errors import ConfigError, PermissionDenied, Unauthenticated
from dstl_server.auth import ADMIN, Authenticator, Principal, check_job

SECRET = "0123456789abcdef-a-strong-node-secret"
OTHER_SECRET = "fedcba9876543210-another-node-secret"


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(SECRET)


def _flip_last(token: str) -> str:
    """The token with the last character of its mac changed."""
    return token[:-1] + ("A" if token[-1] != "A" else "B")


# ---------------------------------------------------------------- tokens


def test_job_token_names_its_job_and_round_trips(auth: Authenticator) -> None:
    token = auth.job_token("job-a")
    assert token.startswith("dstl1.job.job-a.")
    assert auth.principal(token) == Principal("job-a")
    assert not auth.principal(token).admin
    assert auth.job_token("job-a") == token  # derived, not random: stable across restarts
    assert Authenticator(SECRET).job_token("job-a") == token


def test_the_mac_is_hmac_sha256_of_the_subject(auth: Authenticator) -> None:
    digest = hmac.new(SECRET.encode(), b"dstl1/job/job-a", hashlib.sha256).digest()
    mac = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert auth.job_token("job-a") == f"dstl1.job.job-a.{mac}"


def test_admin_token(auth: Authenticator) -> None:
    token = auth.admin_token()
    assert token.startswith("dstl1.admin.")
    assert auth.principal(token) is ADMIN
    assert ADMIN.admin and ADMIN.job_id is None


def test_job_ids_with_dots(auth: Authenticator) -> None:
    token = auth.job_token("flink.job-1.v2")
    assert auth.principal(token) == Principal("flink.job-1.v2")


def test_a_job_named_admin_is_not_the_admin(auth: Authenticator) -> None:
    token = auth.job_token("admin")
    assert auth.principal(token) == Principal("admin")
    assert token != auth.admin_token()


def test_a_token_of_job_a_is_not_valid_for_job_b(auth: Authenticator) -> None:
    token_a = auth.job_token("job-a")
    mac = token_a.rpartition(".")[2]
    with pytest.raises(Unauthenticated, match="wrong token"):
        auth.principal(f"dstl1.job.job-b.{mac}")  # job a's mac under job b's name
    with pytest.raises(Unauthenticated):
        auth.principal(f"dstl1.admin.{mac}")  # nor as the admin token
    assert auth.principal(token_a) == Principal("job-a")


def test_tokens_of_another_secret_are_refused(auth: Authenticator) -> None:
    other = Authenticator(OTHER_SECRET)
    for token in (other.job_token("job-a"), other.admin_token()):
        with pytest.raises(Unauthenticated, match="wrong token"):
            auth.principal(token)


def test_the_secret_is_stripped() -> None:
    assert Authenticator(f"  {SECRET}\n").job_token("j") == Authenticator(SECRET).job_token("j")


@pytest.mark.parametrize("which", ["job", "admin"])
def test_tampered_mac(auth: Authenticator, which: str) -> None:
    token = auth.job_token("job-a") if which == "job" else auth.admin_token()
    for bad in (
        _flip_last(token),
        token[:-1],  # one character short
        token + "A",  # one character more
        token.rpartition(".")[0] + ".",  # no mac
        token.upper(),
    ):
        with pytest.raises(Unauthenticated):
            auth.principal(bad)


@pytest.mark.parametrize(
    "token",
    [
        "",
        " ",
        "dstl1.",
        "dstl1.job.",
        "dstl1.job..mac",  # empty job id
        "dstl1.job.bad/job.mac",
        "dstl1.job.-starts-with-dash.mac",
        "dstl1.admin",
        "dstl1.root.mac",
        "dstl2.job.job-a.mac",
        "Bearer dstl1.job.job-a.mac",
        "dstl1.job.jöb.mac",
        "dstl1.admin.\u00e9\u00e9\u00e9",
        "\x00" * 40,
        "dstl1.job." + "j" * 129 + ".mac",  # job id too long
        "dstl1.job.job-a." + "A" * 600,  # overlong
        "dstl1." + "x" * 10_000,
    ],
)
def test_malformed_tokens(auth: Authenticator, token: str) -> None:
    with pytest.raises(Unauthenticated) as info:
        auth.principal(token)
    assert info.value.grpc_code == "UNAUTHENTICATED"
    assert len(info.value.message) < 200  # the token is never echoed back


def test_overlong_token_with_a_valid_prefix(auth: Authenticator) -> None:
    token = auth.job_token("job-a")
    with pytest.raises(Unauthenticated, match="malformed"):
        auth.principal(token + " " * 1000)  # principal() does not strip


def test_job_token_refuses_a_bad_job_id(auth: Authenticator) -> None:
    for job in ("", "a/b", "x" * 129, "job\n"):
        with pytest.raises(ConfigError):
            auth.job_token(job)


# ---------------------------------------------------------------- metadata


def test_from_metadata(auth: Authenticator) -> None:
    token = auth.job_token("job-a")
    assert auth.from_metadata([("authorization", f"Bearer {token}")]) == Principal("job-a")
    assert auth.from_metadata([("authorization", f"Bearer {token}".encode())]) == Principal("job-a")
    assert auth.from_metadata([("x-other", "v"), ("authorization", f"Bearer  {token} ")]) == (
        Principal("job-a")
    )


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        [],
        [("x-other", "Bearer x")],
        [("authorization", "")],
        [("authorization", " ")],
        [("authorization", "Bearer")],
        [("authorization", "Bearer ")],
        [("authorization", "Bearer  ")],
        [("authorization", "Basic dXNlcjpwYXNz")],
        [("authorization", "bearer dstl1.admin.x")],
        [("authorization", b"\xff\xfe")],
    ],
)
def test_from_metadata_refuses(auth: Authenticator, metadata: Any) -> None:
    with pytest.raises(Unauthenticated):
        auth.from_metadata(metadata)


# ---------------------------------------------------------------- check_job


def test_check_job_without_auth_allows_everything() -> None:
    check_job(None, "job-a")
    check_job(None, "job-b", admin_ok=False)


def test_check_job_for_a_job_principal() -> None:
    a = Principal("job-a")
    check_job(a, "job-a")
    check_job(a, "job-a", admin_ok=False)
    with pytest.raises(PermissionDenied, match="job-a") as info:
        check_job(a, "job-b")
    assert "job-b" in info.value.message
    assert not isinstance(info.value, Unauthenticated)  # authenticated, but not for that job
    assert info.value.grpc_code == "PERMISSION_DENIED"
    with pytest.raises(PermissionDenied):
        check_job(a, "job-a-suffix")  # not a prefix match


def test_check_job_for_the_admin() -> None:
    check_job(ADMIN, "job-a")
    check_job(ADMIN, "any-job", admin_ok=True)
    with pytest.raises(PermissionDenied, match="admin") as info:
        check_job(ADMIN, "job-a", admin_ok=False)  # e.g. creating writers
    assert not isinstance(info.value, Unauthenticated)
