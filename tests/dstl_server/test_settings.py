"""ServerSettings: defaults, DSTL_* variables, flags, validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dstl_client.errors import ConfigError
from dstl_server import cli
from dstl_server.settings import KiB, MiB, ServerSettings, env_name


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
        ("DSTL_BATCH_SIZE_THRESHOLD", "10MiB"),
        ("DSTL_PERSIST_DELAY_MS", "fast"),
        ("DSTL_FSYNC", "maybe"),
    ],
)
def test_malformed_environment_values(var: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        ServerSettings.from_sources(environ={var: raw})
    assert var in info.value.message and repr(raw) in info.value.message


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
    monkeypatch.setenv("DSTL_AUTH_TOKEN", "secret-token")
    assert cli.main(["--persist-delay-ms", "3", "--no-fsync", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "persist_delay_ms = 3.0" in out
    assert "max_writers = 7" in out
    assert "fsync = False" in out
    assert "secret-token" not in out and "auth_token = '***'" in out


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
    ({"log_level": "LOUD"}, ("log_level",)),
]


@pytest.mark.parametrize(("overrides", "names"), INVALID, ids=[repr(c[0]) for c in INVALID])
def test_every_validation_error_names_the_setting(
    overrides: dict[str, Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as info:
        ServerSettings(**overrides)
    for name in names:
        assert name in info.value.message
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
def test_non_loopback_listen_needs_token_or_tls(listen: str) -> None:
    with pytest.raises(ConfigError, match="listen") as info:
        ServerSettings(listen=listen)
    assert "auth_token or TLS" in info.value.message
    ServerSettings(listen=listen, auth_token="t0ken")
    ServerSettings(listen=listen, tls_cert="/cert.pem", tls_key="/key.pem")


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
