"""The answers of one writer stream, sent by one task: those ready together in one message.

Lanes (:mod:`dstl_server.session_lane`) :meth:`Outbox.put` their answers and
go on; the outbox's task writes them. Every persist completed by one flush
resolves in the same turn of the event loop, so their answers are in the
queue together when the task runs, and the answers the stream's reader
gives to the requests of one message are written by the reader itself once
it has handled them all (:meth:`Outbox.flush`): on a ``Mux`` stream they leave in one
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
        #: a message is being written (by the task or by :meth:`flush`)
        self._writing = False
        self._out = metrics.stream_messages.labels("out")
        self._per_message = metrics.stream_requests_per_message.labels("out")
        self._persists_per_message = metrics.stream_persists_per_message

    def put(self, answer: pb.SessionResponse, *, persist: bool = False) -> None:
        """Queue ``answer``. ``persist``: a persist's, from its own task, which wakes the
        outbox's task (counted per message); any other answer is given by the stream's
        reader, which :meth:`flush` es after the message."""
        if self._broken:
            log.info("answer to request %d dropped: the stream ended", answer.id)
            return
        self._queue.append((answer, persist))
        self._drained.clear()
        if persist:
            self._wake.set()

    async def flush(self) -> None:
        """Write what is queued now, if nothing is being written (the stream's reader,
        after the requests of one message: their answers leave together, without a task
        switch); else the task writes it after the message in flight."""
        if self._writing or not self._queue or self._broken:
            return
        batch, self._queue = self._queue, []
        self._writing = True
        try:
            await self._write(batch)
        except Exception as exc:  # the stream ended meanwhile: nobody to answer
            self._broken = True
            log.info("answers not sent: %r", exc)
        finally:
            self._writing = False
        if self._queue:
            self._wake.set()
        else:
            self._drained.set()

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
                if self._queue and not self._writing:
                    batch, self._queue = self._queue, []
                    self._writing = True
                    try:
                        await self._write(batch)
                    finally:
                        self._writing = False
                    continue
                if not self._queue:
                    self._drained.set()
                    if self._closed:
                        return
                # woken by a persist's answer, by close, or by flush once it wrote
                self._wake.clear()
                await self._wake.wait()
        except Exception as exc:  # the stream ended meanwhile: nobody to answer
            self._broken = True
            log.info("answers not sent: %r", exc)
            self._queue.clear()
        finally:
            self._drained.set()

    async def _write(self, batch: list[tuple[pb.SessionResponse, bool]]) -> None:
        if not self._mux:
            for answer, _ in batch:
                await self._ctx.write(answer)
            self._out.inc(len(batch))
            return
        if len(batch) == 1:  # one answer fits a message (checked when it was made)
            await self._write_mux(batch)
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
        persists = sum(1 for _, p in batch if p)
        await self._ctx.write(pb.MuxResponse(answers=[a for a, _ in batch]))
        self._out.inc()
        self._per_message.observe(len(batch))
        if persists:
            self._persists_per_message.observe(persists)
