"""A fuzzing worker thread: picks an operation, sends it, checks it, keeps its model.

The model is what the worker knows of the server: its pool of writers (their
sessions, next seqs and boundaries), its hoarding writer, and the page tokens
ListObjects gave it. Handles from persists go to the run (all workers read them).
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import deque
from typing import Any

from dstl_client.core._pb import dstl_pb2 as pb
from loadtest.wire_fuzz.calls import SESSION_FIELDS, Call, Outcome, Writer, check_health, invoke
from loadtest.wire_fuzz.encoding import c64, clip
from loadtest.wire_fuzz.gen import Gen
from loadtest.wire_fuzz.invariants import check_call
from loadtest.wire_fuzz.settings import (
    HEALTH_EVERY_CALLS,
    HOARD_MODES,
    MUX_FRACTION,
    STREAM_FRACTION,
    WRITER_MAX_CALLS,
    WRITERS_PER_WORKER,
)
from loadtest.wire_fuzz.state import RunState

#: error kinds after which the sidecar refuses every call of the writer
_DEAD_KINDS = frozenset({"writer_failed", "call_lost", "writer_closed", "log_not_found"})
#: ListObjects page tokens a worker keeps for later "next page" calls
_PAGES_KEPT = 16


class FuzzWorker(threading.Thread):
    """One fuzzing thread with its own channel, ``rng`` (from the seed) and generator.

    Its writers, hoarder and page tokens are its own: only this thread
    touches them. Everything shared goes through the :class:`RunState`
    (under its lock). The thread ends at the deadline, at ``max_calls`` or
    when the run is stopped, and closes the writers it still holds unless
    the run stopped early.
    """

    def __init__(self, run: RunState, index: int) -> None:
        super().__init__(name=f"wire-fuzz-{index}", daemon=True)
        self.run_ = run
        self.index = index
        self.rng = random.Random(run.seed * 1000 + index)
        self.gen = Gen(self.rng, run.settings, run.ordered_fraction)
        self.writers: list[Writer] = []
        #: an ordered writer that only ever appends big many-part batches, never persists
        self.hoarder: Writer | None = None
        #: (job, next_page_token) from ListObjects answers
        self.pages: deque[tuple[str, str]] = deque(maxlen=_PAGES_KEPT)
        self.calls = 0

    def run(self) -> None:
        run = self.run_
        with run.lock:
            run.recent[self.index] = deque(maxlen=4)
        channel = run.channel()
        try:
            while not run.stop.is_set() and time.monotonic() < run.deadline:
                if not self._step(channel):
                    break
        except Exception as exc:  # a bug of the fuzzer itself: report it, never hide it
            with run.lock:
                run.report.fuzzer_errors.append(
                    f"worker {self.index}: {exc!r}\n{traceback.format_exc()[-1500:]}"
                )
        finally:
            if not run.report.stopped_early:  # leave nothing behind on a shared server
                for w in [*self.writers, *([self.hoarder] if self.hoarder else [])]:
                    if not w.closed:
                        invoke(channel, self.gen.close(w), timeout_s=2.0)
            channel.close()

    def _retire(self, channel: Any, w: Writer) -> bool:
        """Close a writer the worker gives up (so the fuzzer leaks no writers)."""
        w.dead = True
        if w.closed:
            return True
        w.closed = True
        return self._send(channel, self.gen.close(w))

    def _writer(self, channel: Any) -> Writer | None:
        for w in list(self.writers):
            if (w.dead or w.calls >= WRITER_MAX_CALLS) and not self._retire(channel, w):
                return None
        self.writers = [w for w in self.writers if not w.dead]
        for _ in range(2 * WRITERS_PER_WORKER):
            if len(self.writers) >= WRITERS_PER_WORKER:
                break
            if not self._send(channel, self.gen.create_pooled()):
                return None
        return self.rng.choice(self.writers) if self.writers else None

    def _step(self, channel: Any) -> bool:
        op = self.gen.weighted(self.run_.ops)
        handles = self.run_.snapshot_handles
        call: Call
        if op in ("append", "persist", "last_sqn", "truncate", "close"):
            w = self._writer(channel)
            if w is None:
                return not self.run_.stop.is_set()
            call = {
                "append": self.gen.append,
                "persist": self.gen.persist,
                "last_sqn": self.gen.last_sqn,
                "truncate": self.gen.truncate,
                "close": self.gen.close,
            }[op](w)
        elif op == "hoard":
            if self.hoarder is not None and self.hoarder.dead:
                if not self._retire(channel, self.hoarder):
                    return False
                self.hoarder = None
            if self.hoarder is None:
                call = self.gen.create_pooled(hoarder=True)
            else:
                call = self.gen.append(self.hoarder, HOARD_MODES)
        elif op == "create_bad":
            call = self.gen.create_bad()
        elif op == "read":
            call = self.gen.read(handles())
        elif op == "discard":
            call = self.gen.discard(handles())
        elif op == "list":
            call = self.gen.list_objects(handles(), self.pages)
        elif op == "foreign":
            call = self.gen.foreign()
        elif op == "forward":
            call = self.gen.forward()
        else:
            call = self.gen.garbage(self._garbage_base(handles()))
        # a chaotic writer's call (or garbage made of one) goes on a Session stream at
        # times; an ordered writer's never (a stream ignores seq: its model would drift)
        w = call.writer
        if (
            call.method in SESSION_FIELDS
            and not call.ordered
            and (w is None or not w.ordered)
            and self.rng.random() < STREAM_FRACTION
        ):
            call.stream = True
            call.mux = self.rng.random() < MUX_FRACTION
            call.desc += " [on a Mux stream]" if call.mux else " [on a Session stream]"
        return self._send(channel, call)

    def _garbage_base(self, handles: list[tuple[str, pb.Handle]]) -> Call:
        """A valid-looking request for garbage to start from (flipped, truncated...)."""
        if self.rng.random() < 0.2:
            return self.gen.list_objects(handles, self.pages)
        chaotic = [w for w in self.writers if not w.ordered and not w.dead]
        return self.gen.append(self.rng.choice(chaotic)) if chaotic else self.gen.foreign()

    def _send(self, channel: Any, call: Call) -> bool:
        """Send one call, check it, update the model; False when the run is over."""
        run = self.run_
        n = run.take_call_number()
        if n is None:
            return False
        with run.lock:
            run.in_flight[self.index] = (call.desc, time.monotonic())
        out = invoke(channel, call)
        with run.lock:
            run.in_flight.pop(self.index, None)
            run.report.by_method[call.method] += 1
            run.report.by_kind[out.kind or out.code] += 1
            secs = run.report.seconds_by_method
            secs[call.method] = secs.get(call.method, 0.0) + out.elapsed_s
            run.recent[self.index].append(f"#{n} {clip(call.desc, 300)} -> {out.summary()[:200]}")
        check_call(run, call, out, self.index, n)
        self._update(channel, call, out)
        self.calls += 1
        if self.calls % HEALTH_EVERY_CALLS == 0:
            ok, detail = check_health(channel)
            with run.lock:
                run.report.health_checks += 1
            if not ok:
                run.violate(
                    "health",
                    f"{detail} (worker check after call {n})",
                    call.desc,
                    self.index,
                    n,
                    run.context(),
                )
        return not run.stop.is_set() and time.monotonic() < run.deadline

    def _update(self, channel: Any, call: Call, out: Outcome) -> None:
        """Update the model with what the server answered to ``call``."""
        if call.method == "CreateWriter" and out.code == "OK" and out.response is not None:
            self._created(channel, call, pb.CreateWriterResponse.FromString(out.response))
            return
        if call.method == "ListObjects" and out.code == "OK" and out.response is not None:
            token = pb.ListObjectsResponse.FromString(out.response).next_page_token
            if token and call.listing is not None:
                self.pages.append((call.listing, token))
            return
        if call.writer is not None:
            self._writer_answered(call.writer, call, out)

    def _created(self, channel: Any, call: Call, resp: pb.CreateWriterResponse) -> None:
        if call.pool is not None and call.pool[3] and self.hoarder is None:
            job, kg, ordered, _ = call.pool
            self.hoarder = Writer(resp.log_id, job, kg, ordered, self.rng.getrandbits(64) or 1)
        elif call.pool is not None and len(self.writers) < WRITERS_PER_WORKER:
            job, kg, ordered, _ = call.pool
            self.writers.append(
                Writer(resp.log_id, job, kg, ordered, self.rng.getrandbits(64) or 1)
            )
        else:  # created by a bad-argument probe that got through: do not keep it
            extra = Writer(resp.log_id, "", (0, 0), False, 1)
            invoke(channel, self.gen.close(extra), timeout_s=2.0)

    def _writer_answered(self, w: Writer, call: Call, out: Outcome) -> None:
        w.calls += 1
        w.history.append(f"{clip(call.desc, 300)} -> {out.summary()[:200]}")
        transport_failed = out.kind is None and out.code != "OK"
        if call.ordered:
            w.next_seq += 1
            if transport_failed:
                w.clean = False  # the sidecar may never have seen it: a real gap
        else:
            # a chaotic call: follow the numbers it used so the next ones stay plausible
            used = call.order
            if used is not None and used[1]:
                session, seq = used
                w.next_seq = c64(max(w.next_seq, seq + 1) if session == w.session else seq + 1)
                w.session = session
        if out.code == "OK" and out.response is not None:
            if call.method == "Append":
                w.boundary = max(w.boundary, pb.AppendResponse.FromString(out.response).sqn)
            elif call.method == "LastAppendedSqn":
                w.boundary = pb.SqnResponse.FromString(out.response).sqn
            elif call.method == "PersistDurably":
                handle = pb.PersistResponse.FromString(out.response).handle
                w.boundary = max(w.boundary, handle.to_sqn)
                if handle.entries:
                    self.run_.add_handle(w.job_id, handle, self.rng)
            elif call.method == "CloseWriter":
                w.dead = w.closed = True
        if out.kind in _DEAD_KINDS:
            w.dead = True
        if out.kind == "log_not_found":
            w.closed = True
