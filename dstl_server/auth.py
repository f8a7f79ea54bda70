"""Per-job credentials: who a caller is, and which job's logs and objects it may touch.

Off unless the sidecar has a node secret (``DSTL_AUTH_SECRET`` or
``auth_secret_file``); a secret that is given must be valid (an empty one
refuses to start, see :mod:`dstl_server.settings`), so no auth is only ever
the absence of every secret setting. With a secret, every call but health
checks must carry ``authorization: Bearer <token>``, and the token binds the
caller to exactly one job or to the operator:

* job token: ``dstl1.job.<job_id>.<mac>``, where ``mac`` is the unpadded
  base64url HMAC-SHA256 of ``dstl1/job/<job_id>`` under the node secret;
* admin token: ``dstl1.admin.<mac>`` of ``dstl1/admin``;
* node token: ``dstl1.node.<mac>`` of ``dstl1/node``, which a node of a
  forwarding tree presents to its parent (derived from its own secret, which
  the nodes of a tree share, or read from ``parent_token_file``). It may call ``Forward`` (for any job: a node
  serves every job on it) and nothing else; job and admin tokens may not
  call ``Forward`` at all, so no job can forward into another job.
* any of them may expire: ``dstl1.exp.<unix_seconds>.<kind...>.<mac>`` where
  the mac is of ``dstl1/exp/<unix_seconds>/<subject>``, so the expiry cannot be
  changed or removed without the secret. At or after that second the token
  is UNAUTHENTICATED ("token expired at ..."). Tokens without ``exp`` never
  expire (as before expiry existed).

Rotation: besides the current secret the sidecar may hold the previous one
(``auth_previous_secret``) with a deadline (``auth_previous_secret_until``):
until then tokens of either secret are valid, after it only those of the
current one; new tokens are always minted from the current secret. The
procedure is in docs/deploy.md ("Rotating the node secret").

The sidecar derives tokens, it stores none: an operator mints them with
``dstl-server --print-token JOB_ID`` (or ``admin``; ``--ttl`` for an expiring
one) on a machine that holds the secret and hands each job its own token (e.g.
a Kubernetes Secret per job).
A job token can only create writers of its job, and every later call is
checked against the job that *owns* the log, handle or object it names, never
against a job id the caller wrote into the request. The admin token may read,
close, list and discard any job's logs and objects (the operator CLI), but
creates no writers. Without a secret the node trusts every local caller (the
default listens on loopback or a Unix socket only).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from dstl_client.core.errors import (
    ERROR_KIND_KEY,
    ConfigError,
    PermissionDenied,
    Unauthenticated,
)
from dstl_client.core.keys import check_job_id
from dstl_server.settings import ServerSettings

log = logging.getLogger(__name__)

_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
_PREFIX = "dstl1."
_EXPIRES = "exp."
_STAMP = re.compile(r"[1-9][0-9]{0,11}")  # unix seconds, before the year 33658
_MAX_TOKEN_CHARS = 512
#: callers authenticated with the previous secret that are logged once each; more are counted
_MAX_PREVIOUS_LOGGED = 1024
_MALFORMED = "malformed token (expected a dstl1 job or admin token)"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: one job (``job_id``), the operator (``job_id is None``)
    or a child node of a forwarding tree (``node``; ``job_id is None``)."""

    job_id: str | None
    node: bool = False

    @property
    def admin(self) -> bool:
        return self.job_id is None and not self.node


ADMIN = Principal(None)
NODE = Principal(None, node=True)


def utc_text(unix_s: float) -> str:
    """``2030-01-31T12:00:00Z`` of a unix time (for messages and ``--print-token``)."""
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expiry_after(ttl_s: float, clock: Callable[[], float] = time.time) -> int:
    """The expiry (whole unix seconds, rounded up) of a token minted now with ``ttl_s``."""
    if not math.isfinite(ttl_s) or ttl_s <= 0:
        raise ConfigError(f"a token's ttl must be a positive number of seconds, not {ttl_s!r}")
    return math.ceil(clock() + ttl_s)


class Authenticator:
    """Derives and checks tokens from the node secret (and, while rotating, the previous one).

    Invariants: tokens are minted from the current secret only; a token of
    the previous secret is accepted while ``clock() < previous_until``; an
    expiring token while ``clock() < exp``; the comparison is constant-time.
    Safe from any thread: the only state after construction is the set of
    callers already logged as using the previous secret (guarded by a lock).
    """

    def __init__(
        self,
        secret: str,
        *,
        previous_secret: str = "",
        previous_until: float | None = None,
        clock: Callable[[], float] = time.time,
        on_previous_use: Callable[[], object] = lambda: None,
    ) -> None:
        self._key = secret.strip().encode()
        if not self._key:
            raise ConfigError("an empty node secret derives no tokens (auth_secret)")
        self._previous_key = previous_secret.strip().encode()
        if self._previous_key and previous_until is None:
            raise ConfigError("a previous secret needs its deadline (auth_previous_secret_until)")
        self.previous_until = previous_until if self._previous_key else None
        self._clock = clock
        self._previous_logged: set[Principal] = set()
        self._lock = threading.Lock()
        #: calls authenticated with the previous secret (a rotation is done when it stops
        #: growing); each also calls ``on_previous_use`` (the sidecar's metric)
        self.previous_secret_uses = 0
        self._on_previous_use = on_previous_use

    @classmethod
    def from_settings(
        cls, settings: ServerSettings, on_previous_use: Callable[[], object] = lambda: None
    ) -> Authenticator | None:
        """The sidecar's authenticator; None when no secret is configured (auth off).

        ``on_previous_use`` is called for each call authenticated with the previous
        secret (``dstl_auth_previous_secret_uses_total``)."""
        if not settings.auth_secret:
            return None
        until = settings.auth_previous_deadline
        if until is not None and until <= time.time():
            log.warning(
                "auth_previous_secret_until %s has passed: tokens of the previous secret are "
                "refused; remove auth_previous_secret",
                utc_text(until),
            )
        return cls(
            settings.auth_secret,
            previous_secret=settings.auth_previous_secret,
            previous_until=until,
            on_previous_use=on_previous_use,
        )

    # ------------------------------------------------------------------ minting
    @staticmethod
    def _mac(key: bytes, subject: str) -> str:
        digest = hmac.new(key, f"dstl1/{subject}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def _mint(self, kind: str, subject: str, expires_at: int | None) -> str:
        if expires_at is None:
            return f"{_PREFIX}{kind}.{self._mac(self._key, subject)}"
        if not _STAMP.fullmatch(str(expires_at)):
            raise ConfigError(f"bad token expiry {expires_at!r}: unix seconds, 1 to 12 digits")
        mac = self._mac(self._key, f"exp/{expires_at}/{subject}")
        return f"{_PREFIX}{_EXPIRES}{expires_at}.{kind}.{mac}"

    def job_token(self, job_id: str, *, expires_at: int | None = None) -> str:
        """The token of job ``job_id``; with ``expires_at`` (unix seconds) it expires then."""
        try:
            check_job_id(job_id)
        except Exception as exc:
            raise ConfigError(str(exc)) from None
        return self._mint(f"job.{job_id}", f"job/{job_id}", expires_at)

    def admin_token(self, *, expires_at: int | None = None) -> str:
        return self._mint("admin", "admin", expires_at)

    def node_token(self, *, expires_at: int | None = None) -> str:
        return self._mint("node", "node", expires_at)

    # ----------------------------------------------------------------- checking
    def principal(self, token: str) -> Principal:
        """The caller a token stands for; :class:`Unauthenticated` if it is not valid now."""
        if len(token) > _MAX_TOKEN_CHARS or not token.startswith(_PREFIX):
            raise Unauthenticated(_MALFORMED)
        body = token[len(_PREFIX) :]
        expires: int | None = None
        if body.startswith(_EXPIRES):
            stamp, _, body = body[len(_EXPIRES) :].partition(".")
            if not _STAMP.fullmatch(stamp):
                raise Unauthenticated("malformed token (bad expiry)")
            expires = int(stamp)
        claim, _, mac = body.rpartition(".")
        kind, _, job_id = claim.partition(".")
        if claim == "admin":
            who, subject = ADMIN, "admin"
        elif claim == "node":
            who, subject = NODE, "node"
        elif kind == "job":
            try:
                check_job_id(job_id)
            except Exception:
                raise Unauthenticated("malformed token (bad job id)") from None
            who, subject = Principal(job_id), f"job/{job_id}"
        else:
            raise Unauthenticated(_MALFORMED)
        if expires is not None:
            subject = f"exp/{expires}/{subject}"
        given = mac.encode(errors="replace")
        now = self._clock()
        if not hmac.compare_digest(given, self._mac(self._key, subject).encode()):
            if not self._previous_key or not hmac.compare_digest(
                given, self._mac(self._previous_key, subject).encode()
            ):
                raise Unauthenticated("wrong token for this sidecar's secret")
            assert self.previous_until is not None
            if now >= self.previous_until:
                raise Unauthenticated(
                    "token of the previous node secret, accepted only until "
                    f"{utc_text(self.previous_until)}: mint a new one from the current secret"
                )
            self._used_previous(who)
        if expires is not None and now >= expires:
            raise Unauthenticated(
                f"token expired at {utc_text(expires)}: mint a new one "
                "(dstl-server --print-token JOB_ID --ttl ...)"
            )
        return who

    def _used_previous(self, who: Principal) -> None:
        with self._lock:
            self.previous_secret_uses += 1
            self._on_previous_use()
            first = who not in self._previous_logged
            if first and len(self._previous_logged) < _MAX_PREVIOUS_LOGGED:
                self._previous_logged.add(who)
            else:
                first = False
        if first:
            caller = "node" if who.node else "admin" if who.admin else f"job {who.job_id}"
            assert self.previous_until is not None
            log.warning(
                "%s authenticated with the previous node secret (valid until %s): give it a "
                "token of the current secret",
                caller,
                utc_text(self.previous_until),
                extra={"fields": {"caller": caller}},
            )

    def from_metadata(self, metadata: Iterable[tuple[str, Any]] | None) -> Principal:
        for key, value in metadata or ():
            if key == "authorization":
                text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
                scheme, _, token = text.partition(" ")
                if scheme != "Bearer" or not token:
                    raise Unauthenticated("authorization must be 'Bearer <token>'")
                return self.principal(token.strip())
        raise Unauthenticated("no token: send 'authorization: Bearer <token>'")


def check_job(principal: Principal | None, job_id: str, *, admin_ok: bool = True) -> None:
    """Refuse unless the caller may act on ``job_id`` (no principal: auth is off)."""
    if principal is None:
        return
    if principal.node:
        raise PermissionDenied("a node token may only forward (Forward); use a job's token")
    if principal.admin:
        if admin_ok:
            return
        raise PermissionDenied("the admin token cannot do this; use the job's own token")
    if principal.job_id != job_id:
        raise PermissionDenied(
            f"this token is for job {principal.job_id!r}; the request needs job {job_id!r}"
        )


def check_node(principal: Principal | None) -> None:
    """Refuse ``Forward`` unless the caller is a node (no principal: auth is off)."""
    if principal is not None and not principal.node:
        raise PermissionDenied("only a node token may forward sections (dstl1.node...)")


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without a valid token before their handler runs (health passes).

    Reflection and every other service are covered too. Which *job* a valid
    token may act for is checked by the Changelog handlers (:func:`check_job`).
    Runs on the server's event loop for every call.
    """

    def __init__(self, auth: Authenticator, on_refusal: Callable[[], None]) -> None:
        self._auth = auth
        self._on_refusal = on_refusal

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        if method.startswith(_OPEN_PREFIXES):
            return await continuation(handler_call_details)
        try:
            self._auth.from_metadata(handler_call_details.invocation_metadata)
        except Unauthenticated as exc:
            self._on_refusal()
            return _deny(await continuation(handler_call_details), exc.message)
        return await continuation(handler_call_details)


def _deny(handler: grpc.RpcMethodHandler | None, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that refuses with UNAUTHENTICATED."""

    async def refuse(context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            message,
            trailing_metadata=((ERROR_KIND_KEY, Unauthenticated.kind),),
        )

    async def single(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse(context)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse(context)
        yield None  # pragma: no cover

    deser = handler.request_deserializer if handler else None
    ser = handler.response_serializer if handler else None
    req_stream = handler is not None and handler.request_streaming
    resp_stream = handler is not None and handler.response_streaming
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(req_stream, resp_stream)]
    return make(streaming if resp_stream else single, deser, ser)
