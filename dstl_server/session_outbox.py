"""The answers of one writer stream, sent by one task: those ready together in one message.

Lanes (:mod:`dstl_server.session_lane`) :meth:`Outbox.put` their answers and
go on; the outbox's task writes them. Every persist completed by one flush
resolves in the same turn of the event loop, so their answers are in the
queue together when the task runs: on a ``Mux`` stream they leave in one
``MuxResponse`` (split only where one message would pass
``max_bytes``); on a ``Session`` stream each answer is its own message, as
its clients expect. Answers that come while a message is being written
leave together in the next one.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_server.metrics import ServerMetrics

log = logging.getLogger(__name__)

#: answers queued for the stream at most before it reads no further message
MAX_QUEUED_ANSWERS = 1024
#: turns of the event loop the task lets pass after a wake-up, so answers woken
#: by the same event (one flush) are queued before it takes them
_GATHER_TURNS = 2


class Outbox:
    """One stream's answers, in the order put; written by :meth:`run` only.

    Invariants: answers are written in the order they were put; a
    ``Mux`` message carries at most ``max_bytes`` of answers (one answer
    alone may be larger: it was checked to fit a message); at most
    :data:`MAX_QUEUED_ANSWERS` wait while the stream reads (:meth:`room`).
    After a write fails (the stream ended) answers are dropped, logged.
    Event-loop only.
    """

    def __init__(
        self, ctx: grpc.aio.ServicerContext, metrics: ServerMetrics, *, mux: bool, max_bytes: int
    ) -> None:
        self._ctx = ctx
        self._metrics = metrics
        self._mux = mux
        self._max_bytes = max_bytes
        self._queue: list[tuple[pb.SessionResponse, bool]] = []
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False
        self._broken = False

    def put(self, answer: pb.SessionResponse, *, persist: bool = False) -> None:
        """Queue ``answer`` (``persist``: a persist's, counted per message)."""
        if self._broken:
            log.info("answer to request %d dropped: the stream ended", answer.id)
            return
        self._queue.append((answer, persist))
        self._drained.clear()
        self._wake.set()

    async def room(self) -> None:
        """Until fewer than :data:`MAX_QUEUED_ANSWERS` answers wait (the client reads slowly)."""
        while len(self._queue) >= MAX_QUEUED_ANSWERS and not self._broken:
            self._drained.clear()
            await self._drained.wait()

    async def close(self) -> None:
        """Write what is queued, then stop the task."""
        self._closed = True
        self._wake.set()
        await self._drained.wait()

    async def run(self) -> None:
        """Write queued answers until :meth:`close` (the stream's task)."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                for _ in range(_GATHER_TURNS):
                    await asyncio.sleep(0)
                if self._queue:
                    batch, self._queue = self._queue, []
                    await self._write(batch)
                if not self._queue:
                    self._drained.set()
                    if self._closed:
                        return
        except Exception as exc:  # the stream ended meanwhile: nobody to answer
            self._broken = True
            log.info("answers not sent: %r", exc)
            self._queue.clear()
        finally:
            self._drained.set()

    async def _write(self, batch: list[tuple[pb.SessionResponse, bool]]) -> None:
        metrics = self._metrics
        if not self._mux:
            for answer, _ in batch:
                await self._ctx.write(answer)
            metrics.stream_messages.labels("out").inc(len(batch))
            return
        start = 0
        size = 0
        for i, (answer, _) in enumerate(batch):
            n = answer.ByteSize() + 8
            if i > start and size + n > self._max_bytes:
                await self._write_mux(batch[start:i])
                start, size = i, 0
            size += n
        await self._write_mux(batch[start:])

    async def _write_mux(self, batch: list[tuple[pb.SessionResponse, bool]]) -> None:
        metrics = self._metrics
        persists = sum(1 for _, p in batch if p)
        await self._ctx.write(pb.MuxResponse(answers=[a for a, _ in batch]))
        metrics.stream_messages.labels("out").inc()
        metrics.stream_requests_per_message.labels("out").observe(len(batch))
        if persists:
            metrics.stream_persists_per_message.observe(persists)
