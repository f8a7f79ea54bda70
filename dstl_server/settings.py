"""The sidecar's settings: one frozen, typed, validated object.

Every field has a documented default and unit. ``ServerSettings.from_sources``
builds it from command-line flags and ``DSTL_*`` environment variables (a flag
wins over the environment, the environment over the default) and validates it
before anything starts; a bad value raises :class:`ConfigError` whose one-line
message names the setting (and the flag or variable it came from). The CLI
turns it into exit code 2 (``dstl-server: configuration error: ...``).

* Text becomes a value in one place, :func:`parse_value`, for flags and
  variables alike: integers, finite floats (``nan``/``inf`` are refused),
  booleans (``1/true/yes/on``, ``0/false/no/off``) and sizes. A size (a
  setting whose unit is ``bytes``) is a plain number of bytes or a number with
  a unit: ``512KiB``, ``100MiB``, ``1GiB`` (powers of 1024) or ``10MB``
  (powers of 1000); :func:`parse_size`, :func:`format_size`.
* ``DSTL_*`` variables that are neither a setting nor in
  :data:`OTHER_DSTL_VARIABLES` (the client's and the tools' variables) are
  reported by :func:`unknown_environment` with the closest known name; the
  CLI logs one warning per variable (a misspelled ``DSTL_PERSIST_DELAY`` would
  otherwise be ignored without a word).

Why no pydantic-settings: the settings are one frozen dataclass whose
metadata already drives the CLI flags, ``--help``, the table in docs/sidecar.md and the
Helm chart check; the parsing that pydantic-settings would replace is one
function of about sixty lines (:func:`parse_value`), and the cross-field
rules (loopback vs TLS and secret, the forwarding tree, size relations) stay
hand-written in :meth:`ServerSettings.validate` either way. pydantic would add
two runtime dependencies (pydantic, its compiled core) to the sidecar image,
a second way to declare a setting, and multi-line validation reports that
would need rewriting into the one-line errors the CLI promises.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dstl_client.core.errors import ConfigError
from dstl_server.topology import forwarding_parent

KiB = 1024
MiB = 1024 * KiB


def _setting(default: Any, doc: str, *, unit: str = "", env_only: bool = False) -> Any:
    """A setting; ``env_only`` ones (secrets) have no flag, so they never show in ``ps``."""
    return field(default=default, metadata={"doc": doc, "unit": unit, "env_only": env_only})


#: a node secret must be at least this long (after stripping whitespace)...
MIN_SECRET_CHARS = 32
#: ...and hold at least this many distinct characters
MIN_SECRET_DISTINCT = 12


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Every knob of the sidecar (docs/sidecar.md, "Configuration")."""

    listen: str = _setting(
        "127.0.0.1:7070",
        "TCP address to serve gRPC on (host:port); empty to serve on the Unix socket only. "
        "Addresses other than loopback need TLS and an auth secret.",
    )
    unix_socket: str = _setting("", "Path of a Unix domain socket to serve gRPC on (optional).")
    storage: str = _setting(
        "file:///var/tmp/dstl", "Where objects go: file:///path or s3://bucket/prefix."
    )
    metrics_port: int = _setting(
        9464, "Port of the Prometheus /metrics HTTP endpoint; 0 picks a free one, -1 disables."
    )
    metrics_host: str = _setting(
        "127.0.0.1",
        "IP address the metrics endpoint binds to; other than loopback only with metrics_public.",
    )
    metrics_public: bool = _setting(
        False,
        "Allow a non-loopback metrics_host (the endpoint has no authentication; metrics hold "
        "job ids in logs only, never data or secrets).",
    )
    persist_delay_ms: float = _setting(
        10.0, "Wait after the first persist request before uploading, to batch writers.", unit="ms"
    )
    persist_max_wait_ms: float = _setting(
        40.0,
        "Past persist_delay_ms, keep waiting while writers (or child nodes) that persisted in "
        "the job's previous round have not persisted in this one, uploading when the last "
        "arrives but at most this long after the first request; at or below persist_delay_ms, "
        "never wait past the delay.",
        unit="ms",
    )
    batch_size_threshold: int = _setting(
        10 * MiB, "Upload at once when this many bytes wait for one job.", unit="bytes"
    )
    preemptive_persist_threshold: int = _setting(
        5 * MiB,
        "Upload a writer's changes before any checkpoint asks once it holds this many bytes; "
        "0 disables.",
        unit="bytes",
    )
    max_in_flight_bytes: int = _setting(
        100 * MiB,
        "Change bytes held in memory, over all writers: not yet uploaded, plus those of calls "
        "admitted and not yet applied (e.g. waiting for an earlier call of their writer). A "
        "writer stream's next message is not read while it is reached; a unary call that "
        "finds it reached is refused before decoding (RESOURCE_EXHAUSTED, budget_full) and "
        "the client sends it again after a pause.",
        unit="bytes",
    )
    backpressure_timeout_s: float = _setting(
        60.0,
        "How long a writer's calls may be refused or left unread for a full memory budget "
        "(the client retries them) before RESOURCE_EXHAUSTED (backpressure) fails the writer.",
        unit="s",
    )
    max_change_bytes: int = _setting(4 * MiB, "Largest single change accepted.", unit="bytes")
    max_request_bytes: int = _setting(
        64 * MiB,
        "Largest gRPC message accepted (one append batch); every method's own limit is capped "
        "at it.",
        unit="bytes",
    )
    max_read_request_bytes: int = _setting(
        24 * MiB,
        "Largest ReadChanges request (a handle: any valid one, 100,000 entries at most, fits); "
        "refused before decoding (RESOURCE_EXHAUSTED).",
        unit="bytes",
    )
    max_control_request_bytes: int = _setting(
        2 * MiB,
        "Largest request of a call that carries neither changes nor a handle (CreateWriter, "
        "LastAppendedSqn, Truncate, CloseWriter, ListObjects, DiscardObjects of up to 10,000 "
        "keys); refused before decoding.",
        unit="bytes",
    )
    max_concurrent_uploads: int = _setting(4, "Objects uploaded at the same time.")
    read_cache_bytes: int = _setting(
        64 * MiB,
        "Bodies of objects this sidecar uploaded kept in memory for reads (restores on this"
        " node); 0: off.",
        unit="bytes",
    )
    upload_timeout_s: float = _setting(10.0, "Deadline of one upload attempt.", unit="s")
    upload_max_attempts: int = _setting(3, "Attempts per upload, the first included.")
    upload_retry_base_delay_ms: float = _setting(
        100.0, "First backoff delay between attempts (exponential, jittered).", unit="ms"
    )
    upload_deadline_s: float = _setting(
        30.0, "Total deadline of one upload, every attempt and hedge included.", unit="s"
    )
    hedge_mode: str = _setting(
        "adaptive",
        "Request hedging: 'adaptive' (delay = a quantile of recent upload latencies), "
        "'fixed' (hedge_delay_ms) or 'off'.",
    )
    hedge_delay_ms: float = _setting(500.0, "Hedge delay when hedge_mode is 'fixed'.", unit="ms")
    hedge_quantile: float = _setting(
        0.95, "Latency quantile used as the adaptive hedge delay (0-1)."
    )
    hedge_min_delay_ms: float = _setting(50.0, "Floor of the adaptive hedge delay.", unit="ms")
    hedge_max_delay_ms: float = _setting(2000.0, "Ceiling of the adaptive hedge delay.", unit="ms")
    hedge_budget_fraction: float = _setting(
        0.05, "Hedges allowed as a fraction of uploads in the sliding window (0-1)."
    )
    hedge_budget_window_s: float = _setting(60.0, "Sliding window of the hedge budget.", unit="s")
    s3_endpoint_url: str = _setting(
        "", "S3 endpoint URL (empty: AWS default for the region). E.g. http://127.0.0.1:8333"
    )
    s3_region: str = _setting("", "S3 region (empty: the AWS credential chain's default).")
    s3_verify_tls: bool = _setting(True, "Verify the S3 endpoint's TLS certificate.")
    s3_ca_bundle: str = _setting("", "PEM CA bundle to verify the S3 endpoint with.")
    s3_max_connections: int = _setting(32, "Size of the S3 connection pool.")
    store_probe_interval_s: float = _setting(
        5.0,
        "Seconds between two probes of the store (each bounded by 5 s); while the latest "
        "failed, health reports the Changelog service NOT_SERVING and dstl_store_up is 0.",
        unit="s",
    )
    call_order_timeout_s: float = _setting(
        10.0,
        "How long a writer's call waits for an earlier call that has not arrived yet before "
        "the writer is failed with CALL_LOST.",
        unit="s",
    )
    max_writers: int = _setting(10_000, "Writers registered at the same time, over all jobs.")
    max_writers_per_job: int = _setting(
        1024, "Writers one job may hold at the same time (so one job cannot take every slot)."
    )
    writer_idle_timeout_s: float = _setting(
        3600.0,
        "A writer with no call for this long is closed (its client died); its unpersisted "
        "changes are dropped, its persisted handles stay readable.",
        unit="s",
    )
    max_concurrent_rpcs: int = _setting(
        4096,
        "Calls served at the same time, open writer streams included (each client holds one "
        "Mux stream; an older client one Session stream per writer); more are refused with "
        "RESOURCE_EXHAUSTED. Keep it above the node's clients and unary writers.",
    )
    max_streams_per_connection: int = _setting(
        1024,
        "HTTP/2 streams one client connection may have open at once (grpc.max_concurrent_"
        "streams); a client's further calls wait until one ends.",
    )
    session_bind_timeout_s: float = _setting(
        30.0,
        "A writer stream (Mux or Session) whose first message (naming a writer) does not "
        "come within this long is closed (DEADLINE_EXCEEDED).",
        unit="s",
    )
    keepalive_time_s: float = _setting(
        60.0,
        "Ping a client connection after this long without traffic, to find peers that are "
        "gone; 0: never.",
        unit="s",
    )
    keepalive_timeout_s: float = _setting(
        20.0, "A ping not answered within this long closes the connection.", unit="s"
    )
    max_connection_idle_s: float = _setting(
        600.0,
        "Close a client connection with no call open for this long (the client reconnects at "
        "its next call); 0: never.",
        unit="s",
    )
    auth_secret: str = _setting(
        "",
        "Node secret that job and admin tokens are derived from (HMAC-SHA256); turns on "
        "per-job authentication. Environment only (never a flag); at least 32 characters.",
        env_only=True,
    )
    auth_secret_file: str = _setting(
        "",
        "File holding the node secret (instead of DSTL_AUTH_SECRET). A secret that is given "
        "must be valid: an empty file, or an empty DSTL_AUTH_SECRET, refuses to start; no "
        "auth is leaving both unset (loopback or Unix socket only).",
    )
    auth_previous_secret: str = _setting(
        "",
        "The node secret being rotated out: tokens derived from it stay valid until "
        "auth_previous_secret_until (docs/deploy.md, 'Rotating the node secret'). "
        "Environment only (never a flag); as strong as auth_secret.",
        env_only=True,
    )
    auth_previous_secret_file: str = _setting(
        "", "File holding the previous node secret (instead of DSTL_AUTH_PREVIOUS_SECRET)."
    )
    auth_previous_secret_until: str = _setting(
        "",
        "When tokens of the previous node secret stop working: an ISO 8601 time with its UTC "
        "offset, e.g. 2030-01-31T12:00:00Z; required with a previous secret.",
    )
    tls_cert: str = _setting("", "PEM certificate file; with --tls-key enables TLS on TCP.")
    tls_key: str = _setting("", "PEM private key file for --tls-cert.")
    fsync: bool = _setting(True, "fsync file:// objects and their directory (keep on).")
    shutdown_grace_s: float = _setting(
        30.0, "On SIGTERM, how long in-flight uploads may take to finish.", unit="s"
    )
    log_level: str = _setting("WARNING", "Python log level (logs are JSON lines on stderr).")
    parent: str = _setting(
        "",
        "Parent node (host:port) that flushes below forward_threshold_bytes are forwarded to "
        "(forwarding tree); empty: none (or from tree_index). See docs/sidecar.md, 'Forwarding tree'.",
    )
    parent_token_file: str = _setting(
        "",
        "File holding the node token presented to the parent (dstl-server --print-node-token "
        "on the parent); empty: derived from this node's own auth secret (a tree shares it).",
    )
    parent_ca_file: str = _setting(
        "", "PEM root CA to verify the parent's TLS certificate with; empty: plaintext."
    )
    forward_threshold_bytes: int = _setting(
        1 * MiB, "Flushes smaller than this go to the parent, larger ones upload.", unit="bytes"
    )
    forward_timeout_s: float = _setting(
        5.0,
        "How long a flush waits for the parent's answer before uploading itself "
        "(at most upload_deadline_s).",
        unit="s",
    )
    tree_index: int = _setting(-1, "This node's index in a static tree (0 = root); -1: no tree.")
    tree_size: int = _setting(0, "Nodes in the static tree (with tree_index).")
    tree_fanout: int = _setting(4, "Children per node of the static tree: parent of i = (i-1)//f.")
    tree_address_template: str = _setting(
        "", "Address of tree node {index}, e.g. dstl-{index}.dstl-tree:7070 (with tree_index)."
    )

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------ validation
    def validate(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"setting {name}={getattr(self, name)!r}: {why}")

        if not self.listen and not self.unix_socket:
            raise ConfigError("nothing to listen on: set listen and/or unix_socket")
        if self.listen:
            host, _, port = self.listen.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
                raise bad("listen", "expected host:port")
            if not self.is_loopback(host) and not (self.auth_secret and self.tls_cert):
                raise bad(
                    "listen",
                    "a non-loopback address needs TLS (tls_cert/tls_key) and an auth secret "
                    "(DSTL_AUTH_SECRET or auth_secret_file)",
                )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together")
        if self.auth_secret:
            check_secret_strength("auth_secret", self.auth_secret)
        if self.auth_previous_secret or self.auth_previous_secret_until:
            if not self.auth_previous_secret:
                raise bad(
                    "auth_previous_secret_until",
                    "needs a previous secret (DSTL_AUTH_PREVIOUS_SECRET or "
                    "auth_previous_secret_file)",
                )
            if not self.auth_secret:
                raise ConfigError(
                    "setting auth_previous_secret: a previous secret needs the current one "
                    "(DSTL_AUTH_SECRET or auth_secret_file)"
                )
            check_secret_strength("auth_previous_secret", self.auth_previous_secret)
            if self.auth_previous_secret.strip() == self.auth_secret.strip():
                raise ConfigError(
                    "setting auth_previous_secret: the same as auth_secret (the previous "
                    "secret is the one being rotated out)"
                )
            if not self.auth_previous_secret_until:
                raise ConfigError(
                    "setting auth_previous_secret: needs auth_previous_secret_until, the time "
                    "its tokens stop working (e.g. 2030-01-31T12:00:00Z)"
                )
            parse_deadline("auth_previous_secret_until", self.auth_previous_secret_until)
        check_storage_url(self.storage)
        if not -1 <= self.metrics_port <= 65535:
            raise bad("metrics_port", "expected -1 (off), 0 (any) or a port")
        try:
            metrics_ip = ipaddress.ip_address(self.metrics_host.strip("[]"))
        except ValueError:
            if self.metrics_host != "localhost":
                raise bad("metrics_host", "expected an IP address or localhost") from None
        else:
            if not metrics_ip.is_loopback and not self.metrics_public:
                raise bad(
                    "metrics_host",
                    "a non-loopback metrics address needs metrics_public=true "
                    "(the endpoint is unauthenticated)",
                )
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise bad(f.name, "must be a finite number")
        for name in ("persist_delay_ms", "persist_max_wait_ms", "upload_retry_base_delay_ms"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        for name in (
            "backpressure_timeout_s",
            "upload_timeout_s",
            "shutdown_grace_s",
            "call_order_timeout_s",
            "store_probe_interval_s",
            "session_bind_timeout_s",
            "keepalive_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        for name in ("keepalive_time_s", "max_connection_idle_s"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        for name in (
            "batch_size_threshold",
            "max_in_flight_bytes",
            "max_change_bytes",
            "max_request_bytes",
            "max_read_request_bytes",
            "max_control_request_bytes",
            "max_concurrent_uploads",
            "upload_max_attempts",
            "max_writers",
            "max_writers_per_job",
            "writer_idle_timeout_s",
            "max_concurrent_rpcs",
            "max_streams_per_connection",
        ):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        if self.preemptive_persist_threshold < 0:
            raise bad("preemptive_persist_threshold", "must be >= 0")
        if self.batch_size_threshold > self.max_in_flight_bytes:
            raise bad("batch_size_threshold", "must not exceed max_in_flight_bytes")
        if self.max_change_bytes + 64 * KiB > self.max_request_bytes:
            raise bad("max_change_bytes", "must leave 64 KiB of room below max_request_bytes")
        if self.hedge_mode not in ("adaptive", "fixed", "off"):
            raise bad("hedge_mode", "expected adaptive, fixed or off")
        for name in ("hedge_quantile", "hedge_budget_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise bad(name, "must be between 0 and 1")
        for name in (
            "hedge_delay_ms",
            "hedge_min_delay_ms",
            "upload_deadline_s",
            "hedge_budget_window_s",
        ):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        if self.hedge_max_delay_ms < self.hedge_min_delay_ms:
            raise bad("hedge_max_delay_ms", "must be >= hedge_min_delay_ms")
        if self.s3_max_connections <= 0:
            raise bad("s3_max_connections", "must be > 0")
        forwarding_parent(self)
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise bad("log_level", "expected DEBUG, INFO, WARNING, ERROR or CRITICAL")

    @property
    def auth_previous_deadline(self) -> float | None:
        """Unix time until which tokens of ``auth_previous_secret`` are accepted (None: none)."""
        if not self.auth_previous_secret:
            return None
        return parse_deadline("auth_previous_secret_until", self.auth_previous_secret_until)

    @property
    def parent_address(self) -> str:
        """The parent this node forwards to ("" for none); see :mod:`dstl_server.topology`."""
        return forwarding_parent(self)

    @staticmethod
    def is_loopback(host: str) -> bool:
        host = host.strip("[]")
        if host == "localhost":
            return True
        try:  # an IP literal; a name like "127.example.com" is not loopback
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    # --------------------------------------------------------------- sources
    def replace(self, **changes: Any) -> ServerSettings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def describe(cls) -> list[tuple[str, str, Any, str, str]]:
        """(name, env var, default, unit, doc) for every setting (docs/sidecar.md, --help)."""
        return [
            (f.name, env_name(f.name), f.default, f.metadata["unit"], f.metadata["doc"])
            for f in fields(cls)
        ]

    @classmethod
    def from_sources(
        cls, overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> ServerSettings:
        """Defaults, then ``DSTL_*`` variables, then ``overrides`` (flags)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        source: dict[str, str] = {}  # where a value came from, for error messages
        for f in fields(cls):
            raw = env.get(env_name(f.name))
            # An empty string is a value for text settings (DSTL_LISTEN= serves on the
            # Unix socket only); for numbers and flags it means "not set".
            if raw is not None and (raw != "" or type(f.default) is str):
                values[f.name] = parse_value(f.name, raw, env_name(f.name))
                source[f.name] = env_name(f.name)
        for k, v in (overrides or {}).items():
            if v is not None:
                values[k] = v
                source[k] = flag_name(k)
        _load_secret(values, source, "auth_secret")
        _load_secret(values, source, "auth_previous_secret")
        try:
            return cls(**values)
        except ConfigError as exc:
            # "setting NAME=...: why (from DSTL_<NAME>)" when a flag or variable set it
            m = re.match(r"setting (\w+)\b", exc.message)
            if m and m.group(1) in source and not cls.env_only(m.group(1)):
                raise ConfigError(f"{exc.message} (from {source[m.group(1)]})") from None
            raise

    @classmethod
    def env_only(cls, name: str) -> bool:
        """True for settings (secrets) that have no command-line flag."""
        return bool(cls.__dataclass_fields__[name].metadata["env_only"])


def check_secret_strength(name: str, secret: str) -> None:
    """Refuse a node secret shorter than :data:`MIN_SECRET_CHARS` or with fewer than
    :data:`MIN_SECRET_DISTINCT` distinct characters (after stripping whitespace); the
    message never holds the secret."""
    text = secret.strip()
    if len(text) < MIN_SECRET_CHARS or len(set(text)) < MIN_SECRET_DISTINCT:
        raise ConfigError(
            f"setting {name}: too weak (need at least {MIN_SECRET_CHARS} characters, "
            f"{MIN_SECRET_DISTINCT} of them distinct; e.g. `openssl rand -hex 32`)"
        )


def parse_deadline(name: str, text: str) -> float:
    """Unix time of an ISO 8601 time that names its UTC offset (``2030-01-31T12:00:00Z``)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ConfigError(
            f"setting {name}={text!r}: expected an ISO 8601 time with its UTC offset, "
            "e.g. 2030-01-31T12:00:00Z"
        )
    return when.timestamp()


#: what leaving a secret unset means, for the messages of :func:`_load_secret`
_UNSET_MEANS = {
    "auth_secret": "to run without auth, on loopback or a Unix socket only",
    "auth_previous_secret": "when no rotation is under way",
}


def _load_secret(values: dict[str, Any], source: Mapping[str, str], name: str) -> None:
    """Put the secret ``name`` from its file (setting ``<name>_file``) into ``values``.

    A secret that was given (the variable set, or the file setting given) must
    not be empty: an empty variable, an empty path or a file of whitespace is a
    :class:`ConfigError`, never "no secret". No secret is leaving both unset.
    The messages name where the secret came from, never its text.
    """
    file_name = f"{name}_file"
    unset = _UNSET_MEANS[name]
    if file_name in values:
        path = values[file_name]
        if name in values:
            what = name.replace("_", " ")
            raise ConfigError(f"give the {what} once: {env_name(name)} or {file_name}")
        if not path:
            raise ConfigError(
                f"setting {file_name}: {source.get(file_name, file_name)} names no file "
                f"(leave it unset {unset})"
            )
        try:
            text = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"setting {file_name}={path!r}: cannot read: {exc.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(f"setting {file_name}={path!r}: not UTF-8 text") from None
        if not text:
            raise ConfigError(
                f"setting {file_name}={path!r}: the file is empty (a secret that is given "
                f"must be valid; leave {file_name} unset {unset})"
            )
        values[name] = text
    elif name in values and not str(values[name]).strip():
        raise ConfigError(
            f"setting {name}: {source.get(name, name)} is set but empty (a secret that is "
            f"given must be valid; unset it {unset})"
        )


def check_storage_url(url: str) -> None:
    """Refuse a storage URL the sidecar cannot serve, with one clear line."""
    if url.startswith("s3://"):
        bucket = urlsplit(url).netloc
        if not bucket:
            raise ConfigError(f"setting storage={url!r}: expected s3://bucket[/prefix]")
        return
    if url.startswith("file://"):
        path = url[len("file://") :]
        if not path.startswith("/"):
            raise ConfigError(
                f"setting storage={url!r}: expected an absolute path, file:///path "
                "(file://dir/x names a host 'dir')"
            )
        return
    raise ConfigError(f"setting storage={url!r}: expected file:///path or s3://bucket/prefix")


def env_name(name: str) -> str:
    return "DSTL_" + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def is_size(name: str) -> bool:
    """True for settings given in bytes, which accept units (``100MiB``)."""
    return bool(ServerSettings.__dataclass_fields__[name].metadata["unit"] == "bytes")


#: multipliers of the size units :func:`parse_size` accepts (lower case)
SIZE_UNITS = {
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": 1024 * MiB,
    "tib": 1024 * 1024 * MiB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)
SIZE_SYNTAX = "a size: bytes, or a number with a unit (512KiB, 100MiB, 1GiB; 10MB = 10^7 bytes)"


def parse_size(raw: str) -> int:
    """Bytes of ``512``, ``512KiB``, ``100MiB``, ``1.5GiB``, ``10MB``; ValueError otherwise.

    Units are case-insensitive; ``KiB``/``MiB``/``GiB``/``TiB`` are powers of
    1024, ``KB``/``MB``/``GB``/``TB`` powers of 1000. The result must be a
    whole number of bytes; a negative number is refused here (every size is
    checked against its own range by validation).
    """
    m = _SIZE.fullmatch(raw)
    unit = m.group(2).lower() if m else ""
    if not m or (unit and unit not in SIZE_UNITS):
        raise ValueError(raw)
    number: str = m.group(1)
    scale = SIZE_UNITS.get(unit, 1)
    if "." not in number:
        return int(number) * scale
    whole, frac = number.split(".")
    numerator = int(whole + frac) * scale
    denominator: int = 10 ** len(frac)
    if numerator % denominator:
        raise ValueError(f"{raw}: not a whole number of bytes")
    return numerator // denominator


def format_size(n: int) -> str:
    """The shortest exact binary-unit spelling of ``n`` bytes (``10MiB``, ``1536KiB``, ``100``)."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", MiB), ("KiB", KiB)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def parse_value(name: str, raw: str, source: str) -> Any:
    """The typed value of setting ``name`` from text; ``source`` (a flag or variable)
    names it in the one-line :class:`ConfigError` a malformed value raises."""
    typ: type = type(ServerSettings.__dataclass_fields__[name].default)

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{source}={raw!r}: expected {expected}")

    text = raw.strip()
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise bad("true or false (also 1/0, yes/no, on/off)")
    if typ is int and is_size(name):
        try:
            return parse_size(text)
        except ValueError:
            raise bad(SIZE_SYNTAX) from None
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise bad("an integer") from None
    if typ is float:
        try:
            value = float(text)
        except ValueError:
            raise bad("a number") from None
        if not math.isfinite(value):
            raise bad("a finite number (not nan or inf)")
        return value
    return raw


#: ``DSTL_*`` variables that are not dstl-server settings but are read elsewhere, so
#: the server does not warn about them (the one list: tests check the repository
#: names no other). Value: who reads it.
OTHER_DSTL_VARIABLES: dict[str, str] = {
    "DSTL_ADDRESS": "client: the node's sidecar address (dstl_client.connect)",
    "DSTL_TOKEN": "client: the job's token (dstl_client.connect)",
    "DSTL_CA_FILE": "client: PEM CA bundle of a TLS sidecar (dstl_client.connect)",
    "DSTL_STATE_DIR": "client: node-local state directory (dstl_client.state.clients)",
    "DSTL_REST_URL": "operator CLI: the driver's REST endpoint (dstl_client.ops.context)",
    "DSTL_CONFIG_TOKEN": "operator CLI: the token of the driver's REST endpoint "
    "(dstl_client.ops.tokens)",
    "DSTL_NODE_IP": "Helm chart: the node's IP, to build DSTL_ADDRESS",
    "DSTL_VERSION": "container image build argument (deploy/docker)",
    "DSTL_WEED": "tests: path of the SeaweedFS binary (dstl_server.testing_s3_weed)",
    "DSTL_FUZZ_SEED": "tests: replays a wire fuzz seed (tests/integration/test_wire_fuzz.py)",
}


def unknown_environment(environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(variable, closest known name or "")`` for every unknown ``DSTL_*`` variable."""
    env = os.environ if environ is None else environ
    known = [env_name(f.name) for f in fields(ServerSettings)] + list(OTHER_DSTL_VARIABLES)
    out = []
    for var in sorted(env):
        if var.startswith("DSTL_") and var not in known:
            # compare without the common prefix, which would make every name look close
            close = difflib.get_close_matches(var[5:], [k[5:] for k in known], n=1, cutoff=0.6)
            out.append((var, "DSTL_" + close[0] if close else ""))
    return out
