"""The bounds of the driver's REST endpoint (:mod:`.rest`): connections and slow clients.

The endpoint is a control path in the driver, whose data path (checkpoint
record writes, the sidecar's channels) needs file descriptors, so
:class:`GuardedServer` holds at most ``max_connections`` connections (one
more is answered ``503``, JSON, and closed at once) and closes a connection
that has not sent a complete request head within ``head_timeout_s`` of being
opened or of its previous answer (slowloris, idle keep-alive). A request head
is at most :data:`MAX_HEADERS` header lines of :data:`MAX_FIELD` bytes each.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

#: connections the endpoint holds at most (one more gets 503 and is closed)
DEFAULT_MAX_CONNECTIONS = 64
#: seconds a connection may take to send a complete request head (and a body)
DEFAULT_HEAD_TIMEOUT_S = 5.0
#: header lines of a request head, at most
MAX_HEADERS = 32
#: bytes of a request line or of a header line, at most
MAX_FIELD = 8190
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class GuardedServer(web.Server):
    """aiohttp's low-level server with a connection cap and a head timeout.

    Invariants: at most ``max_connections`` connections are kept (the next
    one is answered 503 and closed in :meth:`connection_made`); a connection
    with no request in its handler for ``head_timeout_s`` (since it opened or
    since its last request ended) is closed by :meth:`reap`. The request
    handler reports each request's start and end (:meth:`request_began`,
    :meth:`request_ended`).

    Thread: the event loop's only (aiohttp calls the hooks there, and
    :meth:`reap` and :meth:`reap_forever` run there).
    """

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        *,
        max_connections: int,
        head_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            handler,
            keepalive_timeout=head_timeout_s,
            max_headers=MAX_HEADERS,
            max_field_size=MAX_FIELD,
            max_line_size=MAX_FIELD,
            **kwargs,
        )
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        #: connections held (accepted, not closed yet); the refused ones are not in it
        self.live: set[RequestHandler] = set()
        #: connection -> requests in its handler now
        self.busy: dict[RequestHandler, int] = {}
        #: connection -> loop time since which it has had no request in its handler
        self.idle_since: dict[RequestHandler, float] = {}
        self.refused = 0
        self.reaped = 0

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self.live) >= self.max_connections:
            self.refused += 1
            body = json.dumps(
                {"error": f"too many connections (at most {self.max_connections}): try again"}
            ).encode()
            transport.write(_REFUSED % (len(body), body))
            # closed once aiohttp's handler task has started (closing here, before it
            # exists, leaves that task failing on Python < 3.12)
            asyncio.get_running_loop().call_soon(transport.close)
            return
        self.live.add(handler)
        self.idle_since[handler] = asyncio.get_running_loop().time()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.live.discard(handler)
        self.busy.pop(handler, None)
        self.idle_since.pop(handler, None)

    def request_began(self, handler: RequestHandler) -> None:
        self.busy[handler] = self.busy.get(handler, 0) + 1

    def request_ended(self, handler: RequestHandler) -> None:
        n = self.busy.get(handler, 0) - 1
        if n > 0:
            self.busy[handler] = n
            return
        self.busy.pop(handler, None)
        if handler in self.idle_since:
            self.idle_since[handler] = asyncio.get_running_loop().time()

    def reap(self) -> int:
        """Close every connection idle (no request in its handler) for ``head_timeout_s``."""
        deadline = asyncio.get_running_loop().time() - self.head_timeout_s
        late = [
            h for h, since in self.idle_since.items() if h not in self.busy and since <= deadline
        ]
        for h in late:
            self.idle_since.pop(h, None)
            h.force_close()
            transport = h.transport
            if transport is not None:
                transport.close()
        self.reaped += len(late)
        return len(late)

    async def reap_forever(self) -> None:
        """:meth:`reap` a few times per ``head_timeout_s`` (at least every second), until
        cancelled."""
        while True:
            await asyncio.sleep(min(1.0, self.head_timeout_s / 4))
            self.reap()
