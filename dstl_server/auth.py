"""Per-job credentials: who a caller is, and which job's logs and objects it may touch.

Off unless the sidecar has a node secret (``DSTL_AUTH_SECRET`` or
``auth_secret_file``). With a secret, every call but health checks must carry
``authorization: Bearer <token>``, and the token binds the caller to exactly
one job or to the operator:

* job token: ``dstl1.job.<job_id>.<mac>``, where ``mac`` is the unpadded
  base64url HMAC-SHA256 of ``dstl1/job/<job_id>`` under the node secret;
* admin token: ``dstl1.admin.<mac>`` of ``dstl1/admin``;
* node token: ``dstl1.node.<mac>`` of ``dstl1/node``, which a node of a
  forwarding tree presents to its parent (derived from its own secret, which
  the nodes of a tree share, or read from ``parent_token_file``). It may call ``Forward`` (for any job: a node
  serves every job on it) and nothing else; job and admin tokens may not
  call ``Forward`` at all, so no job can forward into another job.

The sidecar derives tokens, it stores none: an operator mints them with
``dstl-server --print-token JOB_ID`` (or ``admin``) on a machine that holds the
secret and hands each job its own token (e.g. a Kubernetes Secret per job).
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
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from dstl_client.core.errors import ConfigError, PermissionDenied, Unauthenticated
from dstl_client.core.keys import check_job_id

_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
_PREFIX = "dstl1."
_MAX_TOKEN_CHARS = 512


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


class Authenticator:
    """Derives and checks tokens from the node secret.

    Stateless after construction and safe from any thread; the comparison is
    constant-time.
    """

    def __init__(self, secret: str) -> None:
        self._key = secret.strip().encode()

    def _mac(self, subject: str) -> str:
        digest = hmac.new(self._key, f"dstl1/{subject}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def job_token(self, job_id: str) -> str:
        try:
            check_job_id(job_id)
        except Exception as exc:
            raise ConfigError(str(exc)) from None
        return f"{_PREFIX}job.{job_id}.{self._mac('job/' + job_id)}"

    def admin_token(self) -> str:
        return f"{_PREFIX}admin.{self._mac('admin')}"

    def node_token(self) -> str:
        return f"{_PREFIX}node.{self._mac('node')}"

    def principal(self, token: str) -> Principal:
        """The caller a token stands for; :class:`Unauthenticated` if it is not valid."""
        if len(token) > _MAX_TOKEN_CHARS or not token.startswith(_PREFIX):
            raise Unauthenticated("malformed token (expected a dstl1 job or admin token)")
        body = token[len(_PREFIX) :]
        if body.startswith("admin."):
            expected, who = self.admin_token(), ADMIN
        elif body.startswith("node."):
            expected, who = self.node_token(), NODE
        elif body.startswith("job."):
            job_id = body[len("job.") :].rpartition(".")[0]
            try:
                expected, who = self.job_token(job_id), Principal(job_id)
            except ConfigError:
                raise Unauthenticated("malformed token (bad job id)") from None
        else:
            raise Unauthenticated("malformed token (expected a dstl1 job or admin token)")
        if not hmac.compare_digest(token.encode(), expected.encode()):
            raise Unauthenticated("wrong token for this sidecar's secret")
        return who

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
            trailing_metadata=(("dstl-error-kind", Unauthenticated.kind),),
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
