"""ServerSettings: defaults, DSTL_* variables, flags, validation."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dstl_client.core.errors import ConfigError
from dstl_server import cli
from dstl_server.auth import Authenticator
from dstl_server.settings import (
    MIN_SECRET_CHARS,
    MIN_SECRET_DISTINCT,
    OTHER_DSTL_VARIABLES,
    KiB,
    MiB,
    ServerSettings,
    env_name,
    format_size,
    is_size,
    parse_size,
    parse_value,
    unknown_environment,
)

#: a secret strong enough for the sidecar (32+ characters, 12+ distinct)
SECRET = "0123456789abcdef0123456789abcdef-node-secret"
TLS: dict[str, Any] = {"tls_cert": "/cert.pem", "tls_key": "/key.pem"}


def test_defaults_are_valid_and_documented() -> None:
    s = ServerSettings()
    s.validate()
    assert s.listen == "127.0.0.1:7070"
    assert s.persist_delay_ms == 10.0
    assert s.batch_size_threshold == 10 * MiB
    assert s.preemptive_persist_threshold == 5 * MiB
    assert s.max_in_flight_bytes == 100 * MiB
    rows = ServerSettings.describe()
    assert [r[0] for r in rows] == [f.name for f in dataclasses.fields(ServerSettings)]
    for name, env, default, unit, doc in rows:
        assert env == "DSTL_" + name.upper()
        assert doc.strip(), f"{name} has no documentation"
        assert default == getattr(s, name)
        if name.endswith("_ms"):
            assert unit == "ms", name
        if name.endswith("_s"):
            assert unit == "s", name


def test_settings_are_frozen() -> None:
    s = ServerSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.listen = "127.0.0.1:1"  # type: ignore[misc]
    assert s.replace(max_writers=5).max_writers == 5
    assert s.max_writers == 10_000


def test_environment_variables() -> None:
    env = {
        "DSTL_LISTEN": "127.0.0.1:9999",
        "DSTL_PERSIST_DELAY_MS": "2.5",
        "DSTL_MAX_WRITERS": "42",
        "DSTL_FSYNC": "off",
        "DSTL_S3_VERIFY_TLS": "No",
        "DSTL_STORAGE": "s3://bucket/prefix",
        "DSTL_METRICS_PORT": "",  # empty means unset
        "DSTL_UNKNOWN_THING": "ignored",
        "PERSIST_DELAY_MS": "999",  # no prefix: not ours
    }
    s = ServerSettings.from_sources(environ=env)
    assert s.listen == "127.0.0.1:9999"
    assert s.persist_delay_ms == 2.5
    assert s.max_writers == 42
    assert s.fsync is False
    assert s.s3_verify_tls is False
    assert s.storage == "s3://bucket/prefix"
    assert s.metrics_port == 9464


@pytest.mark.parametrize("raw", ["1", "true", "YES", " on "])
def test_boolean_true_spellings(raw: str) -> None:
    assert ServerSettings.from_sources(environ={"DSTL_FSYNC": raw}).fsync is True


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("DSTL_MAX_WRITERS", "many"),
        ("DSTL_MAX_WRITERS", "1.5"),
        ("DSTL_BATCH_SIZE_THRESHOLD", "10 megabytes"),
        ("DSTL_BATCH_SIZE_THRESHOLD", "10M"),
        ("DSTL_BATCH_SIZE_THRESHOLD", "-1"),
        ("DSTL_BATCH_SIZE_THRESHOLD", "0.5B"),
        ("DSTL_PERSIST_DELAY_MS", "fast"),
        ("DSTL_PERSIST_DELAY_MS", "nan"),
        ("DSTL_FSYNC", "maybe"),
    ],
)
def test_malformed_environment_values(var: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        ServerSettings.from_sources(environ={var: raw})
    assert var in info.value.message and repr(raw) in info.value.message
    assert "\n" not in info.value.message


def test_flag_beats_environment() -> None:
    env = {"DSTL_PERSIST_DELAY_MS": "50", "DSTL_MAX_WRITERS": "7"}
    s = ServerSettings.from_sources({"persist_delay_ms": 1.0, "max_writers": None}, environ=env)
    assert s.persist_delay_ms == 1.0  # the flag
    assert s.max_writers == 7  # no flag given (None): the environment


def test_cli_flag_beats_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DSTL_PERSIST_DELAY_MS", "50")
    monkeypatch.setenv("DSTL_MAX_WRITERS", "7")
    monkeypatch.setenv("DSTL_AUTH_SECRET", SECRET)
    assert cli.main(["--persist-delay-ms", "3", "--no-fsync", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "persist_delay_ms = 3.0" in out
    assert "max_writers = 7" in out
    assert "fsync = False" in out
    assert SECRET not in out and "auth_secret = '***'" in out


def test_cli_reports_bad_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DSTL_MAX_WRITERS", "0")
    assert cli.main(["--print-config"]) == 2
    assert "max_writers" in capsys.readouterr().err


# Each case: overrides, and the setting names the error message must mention.
INVALID: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({"listen": "", "unix_socket": ""}, ("listen", "unix_socket")),
    ({"listen": "no-port"}, ("listen",)),
    ({"listen": "127.0.0.1:"}, ("listen",)),
    ({"listen": ":7070"}, ("listen",)),
    ({"listen": "127.0.0.1:70000"}, ("listen",)),
    ({"listen": "127.0.0.1:http"}, ("listen",)),
    ({"tls_cert": "/c.pem"}, ("tls_cert", "tls_key")),
    ({"tls_key": "/k.pem"}, ("tls_cert", "tls_key")),
    ({"storage": "/var/tmp/dstl"}, ("storage",)),
    ({"storage": "gs://bucket"}, ("storage",)),
    ({"metrics_port": -2}, ("metrics_port",)),
    ({"metrics_port": 65536}, ("metrics_port",)),
    ({"persist_delay_ms": -1.0}, ("persist_delay_ms",)),
    ({"upload_retry_base_delay_ms": -0.5}, ("upload_retry_base_delay_ms",)),
    ({"backpressure_timeout_s": 0.0}, ("backpressure_timeout_s",)),
    ({"upload_timeout_s": -1.0}, ("upload_timeout_s",)),
    ({"shutdown_grace_s": 0.0}, ("shutdown_grace_s",)),
    ({"batch_size_threshold": 0}, ("batch_size_threshold",)),
    ({"max_in_flight_bytes": 0}, ("max_in_flight_bytes",)),
    ({"max_change_bytes": 0}, ("max_change_bytes",)),
    ({"max_request_bytes": 0}, ("max_request_bytes",)),
    ({"max_concurrent_uploads": 0}, ("max_concurrent_uploads",)),
    ({"upload_max_attempts": 0}, ("upload_max_attempts",)),
    ({"max_writers": -1}, ("max_writers",)),
    ({"preemptive_persist_threshold": -1}, ("preemptive_persist_threshold",)),
    ({"max_in_flight_bytes": MiB, "batch_size_threshold": 2 * MiB}, ("batch_size_threshold",)),
    ({"max_change_bytes": 64 * MiB}, ("max_change_bytes",)),
    ({"max_request_bytes": 4 * MiB + 64 * KiB - 1}, ("max_change_bytes",)),
    ({"hedge_mode": "always"}, ("hedge_mode",)),
    ({"hedge_quantile": 1.5}, ("hedge_quantile",)),
    ({"hedge_budget_fraction": -0.1}, ("hedge_budget_fraction",)),
    ({"hedge_delay_ms": 0.0}, ("hedge_delay_ms",)),
    ({"hedge_min_delay_ms": 0.0}, ("hedge_min_delay_ms",)),
    ({"upload_deadline_s": 0.0}, ("upload_deadline_s",)),
    ({"hedge_budget_window_s": 0.0}, ("hedge_budget_window_s",)),
    ({"hedge_min_delay_ms": 100.0, "hedge_max_delay_ms": 50.0}, ("hedge_max_delay_ms",)),
    ({"s3_max_connections": 0}, ("s3_max_connections",)),
    ({"store_probe_interval_s": 0.0}, ("store_probe_interval_s",)),
    ({"store_probe_interval_s": -1.0}, ("store_probe_interval_s",)),
    ({"log_level": "LOUD"}, ("log_level",)),
    # writer quotas and expiry
    ({"max_writers_per_job": 0}, ("max_writers_per_job",)),
    ({"max_writers_per_job": -5}, ("max_writers_per_job",)),
    ({"writer_idle_timeout_s": 0.0}, ("writer_idle_timeout_s",)),
    ({"writer_idle_timeout_s": -1.0}, ("writer_idle_timeout_s",)),
    # storage URLs: a bucket for s3, an absolute path for file
    ({"storage": "s3://"}, ("storage",)),
    ({"storage": "s3:///prefix"}, ("storage",)),
    ({"storage": "file://relative/dir"}, ("storage",)),
    ({"storage": "file://"}, ("storage",)),
    ({"storage": "file:relative"}, ("storage",)),
    ({"storage": ""}, ("storage",)),
    # every float must be finite
    ({"persist_delay_ms": float("nan")}, ("persist_delay_ms",)),
    ({"persist_delay_ms": float("inf")}, ("persist_delay_ms",)),
    ({"upload_timeout_s": float("nan")}, ("upload_timeout_s",)),
    ({"upload_timeout_s": float("inf")}, ("upload_timeout_s",)),
    ({"backpressure_timeout_s": float("inf")}, ("backpressure_timeout_s",)),
    ({"hedge_quantile": float("nan")}, ("hedge_quantile",)),
    ({"hedge_budget_fraction": float("nan")}, ("hedge_budget_fraction",)),
    ({"hedge_max_delay_ms": float("inf")}, ("hedge_max_delay_ms",)),
    ({"shutdown_grace_s": float("-inf")}, ("shutdown_grace_s",)),
    ({"call_order_timeout_s": float("nan")}, ("call_order_timeout_s",)),
    ({"writer_idle_timeout_s": float("inf")}, ("writer_idle_timeout_s",)),
    # metrics_host: an IP address or localhost; non-loopback only with metrics_public
    ({"metrics_host": "0.0.0.0"}, ("metrics_host", "metrics_public")),
    ({"metrics_host": "10.1.2.3"}, ("metrics_host", "metrics_public")),
    ({"metrics_host": "::"}, ("metrics_host", "metrics_public")),
    ({"metrics_host": "not an address"}, ("metrics_host",)),
    ({"metrics_host": "example.com"}, ("metrics_host",)),
    ({"metrics_host": "127.evil.example"}, ("metrics_host",)),
    ({"metrics_host": ""}, ("metrics_host",)),
    # the node secret
    ({"auth_secret": "too-short"}, ("auth_secret",)),
    ({"auth_secret": "x" * 64}, ("auth_secret",)),  # long, but one distinct character
    ({"auth_secret": "   "}, ("auth_secret",)),
]


@pytest.mark.parametrize(("overrides", "names"), INVALID, ids=[repr(c[0]) for c in INVALID])
def test_every_validation_error_names_the_setting(
    overrides: dict[str, Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as info:
        ServerSettings(**overrides)
    for name in names:
        assert name in info.value.message
    assert "\n" not in info.value.message  # one line
    # the same through the environment
    env = {env_name(k): str(v) for k, v in overrides.items()}
    with pytest.raises(ConfigError):
        ServerSettings.from_sources(environ=env)


def test_boundary_values_are_accepted() -> None:
    ServerSettings(
        persist_delay_ms=0.0,
        preemptive_persist_threshold=0,
        metrics_port=-1,
        hedge_quantile=1.0,
        hedge_budget_fraction=0.0,
        max_in_flight_bytes=MiB,
        batch_size_threshold=MiB,
        max_change_bytes=4 * MiB,
        max_request_bytes=4 * MiB + 64 * KiB,
        hedge_min_delay_ms=100.0,
        hedge_max_delay_ms=100.0,
        log_level="debug",
    )
    ServerSettings(listen="", unix_socket="/tmp/dstl.sock")
    ServerSettings(metrics_port=0, listen="127.0.0.1:0")


@pytest.mark.parametrize(
    "listen", ["0.0.0.0:7070", "10.1.2.3:7070", "[::]:7070", "node1:7070", "127.evil.example:70"]
)
def test_non_loopback_listen_needs_tls_and_a_secret(listen: str) -> None:
    # neither, only a secret, only TLS: each refused, naming what is missing
    extras: list[dict[str, Any]] = [{}, {"auth_secret": SECRET}, TLS]
    for extra in extras:
        with pytest.raises(ConfigError, match="listen") as info:
            ServerSettings(listen=listen, **extra)
        assert "TLS" in info.value.message and "auth secret" in info.value.message
    ServerSettings(listen=listen, auth_secret=SECRET, **TLS)


@pytest.mark.parametrize(
    "listen", ["127.0.0.1:7070", "127.5.6.7:1", "localhost:7070", "[::1]:7070"]
)
def test_loopback_listen_needs_nothing(listen: str) -> None:
    assert ServerSettings(listen=listen).listen == listen


def test_is_loopback() -> None:
    assert ServerSettings.is_loopback("127.0.0.1")
    assert ServerSettings.is_loopback("[::1]")
    assert not ServerSettings.is_loopback("0.0.0.0")
    assert not ServerSettings.is_loopback("::")
    assert not ServerSettings.is_loopback("example.com")
    assert not ServerSettings.is_loopback("127.example.com")  # a name, not an address
    assert not ServerSettings.is_loopback("127.0.0.1.nip.io")


# ---------------------------------------------------------------- new validations


@pytest.mark.parametrize(
    "storage",
    [
        "file:///",
        "file:///var/lib/dstl",
        "s3://bucket",
        "s3://bucket/",
        "s3://bucket/some/prefix",
    ],
)
def test_good_storage_urls(storage: str) -> None:
    assert ServerSettings(storage=storage).storage == storage


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_metrics_hosts_need_nothing(host: str) -> None:
    assert ServerSettings(metrics_host=host).metrics_host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_public_metrics_host_with_metrics_public(host: str) -> None:
    assert ServerSettings(metrics_host=host, metrics_public=True).metrics_public
    s = ServerSettings.from_sources(
        environ={"DSTL_METRICS_HOST": host, "DSTL_METRICS_PUBLIC": "true"}
    )
    assert s.metrics_host == host


def test_metrics_public_does_not_allow_names() -> None:
    with pytest.raises(ConfigError, match="metrics_host"):
        ServerSettings(metrics_host="example.com", metrics_public=True)


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity", " nan "])
def test_non_finite_floats_from_the_environment(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"^DSTL_PERSIST_DELAY_MS=.*: expected a finite number"):
        ServerSettings.from_sources(environ={"DSTL_PERSIST_DELAY_MS": raw})


def test_every_float_setting_must_be_finite() -> None:
    floats = [f.name for f in dataclasses.fields(ServerSettings) if type(f.default) is float]
    assert "writer_idle_timeout_s" in floats and len(floats) > 10
    for name in floats:
        for value in (float("nan"), float("inf"), float("-inf")):
            kwargs: dict[str, Any] = {name: value}
            with pytest.raises(ConfigError) as info:
                ServerSettings(**kwargs)
            assert f"setting {name}=" in info.value.message, (name, value)


def test_writer_quota_and_idle_defaults() -> None:
    s = ServerSettings()
    assert s.max_writers_per_job == 1024
    assert s.writer_idle_timeout_s == 3600.0
    s = ServerSettings.from_sources(
        environ={"DSTL_MAX_WRITERS_PER_JOB": "3", "DSTL_WRITER_IDLE_TIMEOUT_S": "1.5"}
    )
    assert (s.max_writers_per_job, s.writer_idle_timeout_s) == (3, 1.5)


# ---------------------------------------------------------------- the node secret


def test_secret_strength() -> None:
    weakest = "abcdefghijkl" + "a" * (MIN_SECRET_CHARS - MIN_SECRET_DISTINCT)
    assert len(weakest) == MIN_SECRET_CHARS and len(set(weakest)) == MIN_SECRET_DISTINCT
    assert ServerSettings(auth_secret=weakest).auth_secret == weakest
    too_short = weakest[:-1]
    too_few_distinct = "abcdefghijk" + "a" * (MIN_SECRET_CHARS - MIN_SECRET_DISTINCT + 1)
    # padding does not make a secret longer: it is stripped
    padded = "  " + weakest[:-1] + "\n"
    for weak in (too_short, too_few_distinct, padded):
        with pytest.raises(ConfigError, match="auth_secret: too weak") as info:
            ServerSettings(auth_secret=weak)
        assert weak.strip() not in info.value.message  # never echoed


def test_auth_secret_is_environment_only() -> None:
    assert ServerSettings.env_only("auth_secret")
    names = [f.name for f in dataclasses.fields(ServerSettings)]
    assert [n for n in names if ServerSettings.env_only(n)] == [
        "auth_secret",
        "auth_previous_secret",
    ]
    assert "auth_token" not in names
    s = ServerSettings.from_sources(environ={"DSTL_AUTH_SECRET": SECRET})
    assert s.auth_secret == SECRET


def test_cli_has_no_secret_flag(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    flags = {opt for action in parser._actions for opt in action.option_strings}
    assert "--auth-secret" not in flags and "--auth-token" not in flags
    assert "--auth-secret-file" in flags and "--print-token" in flags
    for argv in (["--auth-secret", SECRET], ["--auth-token", SECRET]):
        # no flag, and no abbreviation of --auth-secret-file either
        with pytest.raises(SystemExit) as info:
            parser.parse_args(argv)
        assert info.value.code == 2
    capsys.readouterr()


def test_secret_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    s = ServerSettings.from_sources({"auth_secret_file": str(path)}, environ={})
    assert s.auth_secret == SECRET  # the trailing newline is stripped
    s = ServerSettings.from_sources(environ={"DSTL_AUTH_SECRET_FILE": str(path)})
    assert s.auth_secret == SECRET


def test_secret_file_and_environment_together_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET)
    with pytest.raises(ConfigError, match="auth secret once"):
        ServerSettings.from_sources(
            {"auth_secret_file": str(path)}, environ={"DSTL_AUTH_SECRET": SECRET}
        )


def test_unreadable_secret_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError, match="auth_secret_file") as info:
        ServerSettings.from_sources({"auth_secret_file": str(missing)}, environ={})
    assert "cannot read" in info.value.message
    with pytest.raises(ConfigError, match="auth_secret_file"):
        ServerSettings.from_sources({"auth_secret_file": str(tmp_path)}, environ={})  # a dir


def test_weak_secret_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("short\n")
    with pytest.raises(ConfigError, match="auth_secret: too weak"):
        ServerSettings.from_sources({"auth_secret_file": str(path)}, environ={})


# ---------------------------------------------------------------- CLI


def test_print_config_masks_a_secret_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DSTL_AUTH_SECRET", raising=False)
    path = tmp_path / "secret"
    path.write_text(SECRET)
    assert cli.main(["--auth-secret-file", str(path), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out and "auth_secret = '***'" in out
    assert f"auth_secret_file = {str(path)!r}" in out


def test_print_config_without_a_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DSTL_AUTH_SECRET", raising=False)
    monkeypatch.delenv("DSTL_AUTH_SECRET_FILE", raising=False)
    assert cli.main(["--print-config"]) == 0
    assert "auth_secret = ''" in capsys.readouterr().out


def test_print_token(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DSTL_AUTH_SECRET", SECRET)
    auth = Authenticator(SECRET)
    assert cli.main(["--print-token", "job-a"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == auth.job_token("job-a")
    assert auth.principal(out).job_id == "job-a"
    assert cli.main(["--print-admin-token"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == auth.admin_token() and auth.principal(out).admin
    # a job that happens to be named "admin" gets a job token, never the admin's
    assert cli.main(["--print-token", "admin"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == auth.job_token("admin") and not auth.principal(out).admin


def test_print_token_refuses_a_bad_job_id(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DSTL_AUTH_SECRET", SECRET)
    assert cli.main(["--print-token", "bad/job"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "bad job id" in captured.err


def test_print_token_needs_a_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DSTL_AUTH_SECRET", raising=False)
    monkeypatch.delenv("DSTL_AUTH_SECRET_FILE", raising=False)
    assert cli.main(["--print-token", "job-a"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "auth secret" in captured.err


def test_print_token_with_a_weak_secret_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DSTL_AUTH_SECRET", "weak")
    assert cli.main(["--print-token", "job-a"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "auth_secret" in captured.err and "weak" in captured.err


@pytest.mark.parametrize(("abandoned", "code"), [(0, 0), (2, 3)])
def test_main_exit_code_when_shutdown_abandons_persists(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    abandoned: int,
    code: int,
) -> None:
    import dstl_server.logs

    seen: list[ServerSettings] = []

    async def fake_serve(settings: ServerSettings) -> int:
        seen.append(settings)
        return abandoned

    monkeypatch.setattr(cli, "serve", fake_serve)
    monkeypatch.setattr(cli, "_fix_malloc_mmap_threshold", lambda: None)
    monkeypatch.setattr(dstl_server.logs, "setup_logging", lambda level: None)
    assert cli.main(["--shutdown-grace-s", "7"]) == code
    assert len(seen) == 1 and seen[0].shutdown_grace_s == 7.0
    err = capsys.readouterr().err
    if abandoned:
        assert "cut off 2 in-flight persist(s)" in err and "shutdown_grace_s=7" in err
    else:
        assert err == ""


# ---------------------------------------------------------------- sizes with units


@pytest.mark.parametrize(
    ("raw", "size"),
    [
        ("0", 0),
        ("123", 123),
        ("512KiB", 512 * KiB),
        ("100MiB", 100 * MiB),
        ("1GiB", 1024 * MiB),
        ("2TiB", 2 * 1024 * 1024 * MiB),
        ("10MB", 10_000_000),
        ("10kb", 10_000),
        ("3GB", 3_000_000_000),
        ("64B", 64),
        ("1.5MiB", 3 * MiB // 2),
        ("0.5KiB", 512),
        (" 4 mib ", 4 * MiB),  # spaces and case do not matter
    ],
)
def test_parse_size(raw: str, size: int) -> None:
    assert parse_size(raw) == size


@pytest.mark.parametrize(
    "raw", ["", "MiB", "-1", "1e6", "0x10", "10M", "10 megabytes", "1.5", "0.1KiB", "1,000", "nan"]
)
def test_parse_size_refuses(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_size(raw)


@pytest.mark.parametrize("n", [0, 1, 100, KiB, 1536 * KiB, 10 * MiB, 64 * MiB, 1024 * MiB, 10**7])
def test_format_size_round_trips(n: int) -> None:
    assert parse_size(format_size(n)) == n
    assert format_size(10 * MiB) == "10MiB" and format_size(1536 * KiB) == "1536KiB"


def test_every_bytes_setting_accepts_units() -> None:
    sizes = [f.name for f in dataclasses.fields(ServerSettings) if is_size(f.name)]
    assert {"max_in_flight_bytes", "max_change_bytes", "forward_threshold_bytes"} <= set(sizes)
    for name in sizes:
        assert type(getattr(ServerSettings(), name)) is int
        assert parse_value(name, "2MiB", "x") == 2 * MiB
    s = ServerSettings.from_sources(
        {"max_in_flight_bytes": 2 * 1024 * MiB},
        environ={"DSTL_MAX_CHANGE_BYTES": "8MiB", "DSTL_BATCH_SIZE_THRESHOLD": "16MB"},
    )
    assert (s.max_change_bytes, s.batch_size_threshold) == (8 * MiB, 16_000_000)


def test_cli_flags_accept_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    ns = cli.build_parser().parse_args(["--max-in-flight-bytes", "1GiB", "--max-writers", "5"])
    assert (ns.max_in_flight_bytes, ns.max_writers) == (1024 * MiB, 5)


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("max_writers", "1.5", "an integer"),
        ("max_writers", "ten", "an integer"),
        ("persist_delay_ms", "soon", "a number"),
        ("persist_delay_ms", "inf", "a finite number"),
        ("fsync", "maybe", "true or false"),
        ("max_change_bytes", "four", "a size"),
    ],
)
def test_parse_value_errors_name_the_source(name: str, raw: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_value(name, raw, "--some-flag")
    assert info.value.message.startswith(f"--some-flag={raw!r}: expected {expected}")


def test_validation_errors_name_the_flag_or_variable() -> None:
    with pytest.raises(ConfigError) as info:
        ServerSettings.from_sources(environ={"DSTL_MAX_WRITERS": "0"})
    assert info.value.message == "setting max_writers=0: must be > 0 (from DSTL_MAX_WRITERS)"
    with pytest.raises(ConfigError) as info:
        ServerSettings.from_sources({"max_writers": 0}, environ={"DSTL_MAX_WRITERS": "3"})
    assert info.value.message.endswith("(from --max-writers)")
    with pytest.raises(ConfigError) as info:  # a rule over two settings: none named as source
        ServerSettings.from_sources(environ={"DSTL_LISTEN": ""})
    assert "from" not in info.value.message


# ---------------------------------------------------------------- unknown DSTL_* variables


def test_unknown_variables_are_reported_with_the_closest_name() -> None:
    env = {
        "DSTL_PERSIST_DELAY": "5",  # missing _MS
        "DSTL_MAX_INFLIGHT_BYTES": "1",
        "DSTL_TOKENS": "x",
        "DSTL_SOMETHING_ELSE": "x",
        "DSTL_LISTEN": "127.0.0.1:1",  # a setting
        "DSTL_ADDRESS": "x",  # read by the client
        "PERSIST_DELAY": "x",  # not ours
    }
    assert unknown_environment(env) == [
        ("DSTL_MAX_INFLIGHT_BYTES", "DSTL_MAX_IN_FLIGHT_BYTES"),
        ("DSTL_PERSIST_DELAY", "DSTL_PERSIST_DELAY_MS"),
        ("DSTL_SOMETHING_ELSE", ""),
        ("DSTL_TOKENS", "DSTL_TOKEN"),
    ]
    known = {env_name(f.name): "x" for f in dataclasses.fields(ServerSettings)}
    assert unknown_environment({**known, **dict.fromkeys(OTHER_DSTL_VARIABLES, "x")}) == []


def test_every_dstl_variable_in_the_repository_is_known() -> None:
    """A DSTL_* name used anywhere (client, chart, images, tests, docs) is a setting or in
    OTHER_DSTL_VARIABLES, so the server never warns about a variable the project reads."""
    root = Path(__file__).resolve().parents[2]
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found: dict[str, str] = {}
    for name in files:
        path = root / name
        text_like = path.suffix in {".py", ".md", ".yaml", ".tpl", ".txt", ".json", ".sh", ""}
        if not text_like and "Dockerfile" not in path.name:
            continue
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        for var in re.findall(r"\bDSTL_[A-Z0-9_]*[A-Z0-9]\b", text):
            found.setdefault(var, name)
    assert "DSTL_ADDRESS" in found and "DSTL_LISTEN" in found
    # examples of unknown names in the tests and docs of this very check
    examples = {"DSTL_PERSIST_DELAY", "DSTL_UNKNOWN_THING", "DSTL_MAX_INFLIGHT_BYTES"}
    examples |= {"DSTL_TOKENS", "DSTL_SOMETHING_ELSE", "DSTL_S3_ENDPOINT"}
    unknown = {
        var: where
        for var, where in found.items()
        if var not in examples and unknown_environment({var: ""})
    }
    assert unknown == {}, "add these to settings.OTHER_DSTL_VARIABLES (or make them settings)"
