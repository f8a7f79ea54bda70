"""The child side of the forwarding tree: small flushes go to the parent node.

A node with a parent (``parent`` or ``tree_*`` settings) hands each flush
whose encoded size is below ``forward_threshold_bytes`` to
:meth:`ParentForwarder.forward`: the already-encoded log sections travel as
they are in one ``Forward`` call over one long-lived gRPC channel; the
parent merges them into its next object of the job and answers, once that
object is complete, with its key and where each section landed. Any failure
(unreachable, past ``forward_timeout_s``, an error, an answer that does not
match what was sent) returns None and the caller uploads the flush itself:
the handle then names only the caller's own object, never both. After a
failure the parent is not asked again for a backoff period (doubling,
jittered, capped), so a dead parent costs one failed call per period.

The parent side: :class:`ForwardedSection` is a child's section, checked
by :func:`decode_forwarded`, queued in the parent's job scheduler
(:meth:`dstl_server.uploads.Uploads.accept_forwarded`). The token a node
presents is :func:`node_token` (see :mod:`dstl_server.auth`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import ConfigError, CorruptObject, InvalidArgument, PermissionDenied
from dstl_client.core.format import EncodedSection, verify_log_section
from dstl_client.core.handle import HandleEntry
from dstl_client.core.keys import check_key_of_job
from dstl_server.auth import Authenticator
from dstl_server.metrics import ServerMetrics
from dstl_server.request_bounds import MAX_FORWARD_SECTIONS
from dstl_server.settings import ServerSettings

log = logging.getLogger(__name__)

_FORWARD_METHOD = "/dstl.v1.Changelog/Forward"
#: first and largest pause before the parent is asked again after a failure
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0

#: (object key, (offset, length) per section in the order sent)
Placed = tuple[str, list[tuple[int, int]]]


class ParentForwarder:
    """One node's link to its parent: one channel, a backoff after failures.

    Invariants: :meth:`forward` never raises and never waits past
    ``timeout_s``; it returns a placement only when the parent answered with
    one placement per section sent, each of the sent length, in an object
    under the job's prefix (so a handle built from it reads exactly like one
    of an own upload). Event-loop only: the job schedulers'
    upload tasks call :meth:`forward`; :class:`~dstl_server.app.DstlServer`
    calls :meth:`close` at stop.
    """

    def __init__(
        self,
        address: str,
        *,
        threshold_bytes: int,
        timeout_s: float,
        metrics: ServerMetrics,
        token: str = "",
        ca_file: str = "",
        max_message_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self.threshold_bytes = threshold_bytes
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._token = token
        self._ca_file = ca_file
        self._max_message_bytes = max_message_bytes
        self._clock = clock
        self._channel: grpc.aio.Channel | None = None
        #: who this node is to its parent (random per process): see ForwardRequest.sender
        self.sender = uuid.uuid4().hex
        self._failures = 0
        self._retry_at = 0.0

    @classmethod
    def from_settings(
        cls, settings: ServerSettings, metrics: ServerMetrics
    ) -> ParentForwarder | None:
        """The forwarder the settings ask for; None without a parent."""
        address = settings.parent_address
        if not address:
            return None
        return cls(
            address,
            threshold_bytes=settings.forward_threshold_bytes,
            timeout_s=settings.forward_timeout_s,
            metrics=metrics,
            token=node_token(settings),
            ca_file=settings.parent_ca_file,
            max_message_bytes=settings.max_request_bytes,
        )

    def wants(self, nbytes: int) -> bool:
        """True for a flush of ``nbytes`` encoded bytes that should go to the parent."""
        return nbytes < self.threshold_bytes

    def _open(self) -> grpc.aio.Channel:
        if self._channel is None:
            options = [
                ("grpc.max_send_message_length", self._max_message_bytes),
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.keepalive_time_ms", 30_000),
            ]
            if self._ca_file:
                creds = grpc.ssl_channel_credentials(Path(self._ca_file).read_bytes())
                self._channel = grpc.aio.secure_channel(self.address, creds, options=options)
            else:
                self._channel = grpc.aio.insecure_channel(self.address, options=options)
        return self._channel

    async def forward(self, job_id: str, sections: Sequence[EncodedSection]) -> Placed | None:
        """Have the parent place ``sections`` in one object; None: upload them yourself."""
        if self._clock() < self._retry_at:
            self.metrics.forward_fallbacks.labels("backoff").inc()
            return None
        if len(sections) > MAX_FORWARD_SECTIONS:  # more than a parent accepts in one call
            return None
        request = pb.ForwardRequest(
            job_id=job_id, sections=[b"".join(s.chunks) for s in sections], sender=self.sender
        )
        nbytes = sum(s.length for s in sections)
        metadata = (("authorization", f"Bearer {self._token}"),) if self._token else None
        started = self._clock()
        try:
            call = self._open().unary_unary(
                _FORWARD_METHOD,
                request_serializer=pb.ForwardRequest.SerializeToString,
                response_deserializer=pb.ForwardResponse.FromString,
            )
            response = await call(request, timeout=self.timeout_s, metadata=metadata)
            placed = _check_answer(job_id, sections, response)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            reason = {
                grpc.StatusCode.UNAVAILABLE: "unavailable",
                grpc.StatusCode.DEADLINE_EXCEEDED: "deadline",
            }.get(code, "error")
            return self._failed(reason, f"{code.name}: {exc.details()}")
        except (ValueError, PermissionDenied) as exc:
            return self._failed("bad_answer", str(exc))
        except Exception as exc:  # a broken channel must never fail the flush
            return self._failed("error", repr(exc))
        self.metrics.forward_latency.observe(self._clock() - started)
        self.metrics.forwarded_batches.inc()
        self.metrics.forwarded_bytes.inc(nbytes)
        self._failures = 0
        self._retry_at = 0.0
        return placed

    def _failed(self, reason: str, detail: str) -> Placed | None:
        self.metrics.forward_fallbacks.labels(reason).inc()
        self._failures += 1
        pause = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (self._failures - 1))
        self._retry_at = self._clock() + pause * random.uniform(0.5, 1.0)
        log.warning(
            "forward to parent %s failed (%s: %s); uploading directly, next try in %.1fs",
            self.address,
            reason,
            detail,
            pause,
        )
        return None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


@dataclass(slots=True, eq=False)
class ForwardedSection:
    """A log section a child node forwarded, already encoded; it joins this node's next object.

    Invariants: ``section`` passed :func:`verify_log_section` (its log id and
    SQN range are the header's); ``future`` is completed exactly once by the
    scheduler, like an :class:`UploadTask`'s. Event-loop only.
    """

    section: EncodedSection
    future: asyncio.Future[HandleEntry] = field(repr=False)
    preemptive: bool = True  # never counts as a local writer waiting to persist

    @property
    def nbytes(self) -> int:
        return self.section.length

    @property
    def first_sqn(self) -> int:
        return self.section.first_sqn

    @property
    def end_sqn(self) -> int:
        return self.section.end_sqn

    def encode(self) -> EncodedSection:
        return self.section


def decode_forwarded(data: bytes) -> EncodedSection:
    """A forwarded section as sent, checked: the header's and every block's checksum, the
    index covering the section (a section that does not verify never joins an object)."""
    try:
        hdr = verify_log_section(data)
    except CorruptObject as exc:
        raise InvalidArgument(
            f"forwarded section is not a valid log section: {exc.message}"
        ) from None
    return EncodedSection(hdr.log_id, hdr.first_sqn, hdr.end_sqn, [data], len(data))


def node_token(settings: ServerSettings) -> str:
    """The token this node presents to its parent: from ``parent_token_file``, else derived
    from its own auth secret (nodes of a tree share it), else none (auth off)."""
    if settings.parent_token_file:
        try:
            token = Path(settings.parent_token_file).read_text().strip()
        except OSError as exc:
            raise OSError(f"cannot read parent_token_file: {exc.strerror}") from None
        if not token:  # a token that is given must be one: never forward without it
            raise ConfigError(
                f"setting parent_token_file={settings.parent_token_file!r}: the file is empty"
            )
        return token
    return Authenticator(settings.auth_secret).node_token() if settings.auth_secret else ""


def _check_answer(
    job_id: str, sections: Sequence[EncodedSection], response: pb.ForwardResponse
) -> Placed:
    """The parent's answer as placements, if it matches what was sent (else ValueError)."""
    if len(response.placements) != len(sections):
        raise ValueError(
            f"parent placed {len(response.placements)} sections, {len(sections)} were sent"
        )
    check_key_of_job(job_id, response.object_key)
    out: list[tuple[int, int]] = []
    for sec, p in zip(sections, response.placements, strict=True):
        if p.length != sec.length:
            raise ValueError(f"parent placed a section of {sec.length} bytes as {p.length}")
        out.append((p.offset, p.length))
    return response.object_key, out
