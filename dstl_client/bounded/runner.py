"""Sorted mode's runners: a bounded input, sorted by key, one key at a time (FLIP-140).

Engine-neutral (Spark's side is :mod:`.task`; tests drive these directly).
The input is an iterator of ``(key, rows)`` in strictly increasing key order,
each key once; the state lives in a :class:`~.backend.SingleKeyBackend` and
is dropped when the key ends. Nothing is logged or checkpointed: a failed
task is simply run again on its (bounded) input.

* :class:`SortedKeyedRunner` / :func:`run_sorted`: the ``fn(key, rows, ctx)``
  API of :mod:`dstl_client.state` (``ctx`` a
  :class:`~dstl_client.state.api.KeyedContext`, ``ctx.batch_id == 0``).
* :class:`SortedProcessorRunner` / :func:`run_sorted_processor`: a
  :class:`~dstl_client.processor.api.StatefulProcessor` with the processor's
  own handle, states, timers and TTL over the single-key backend.

**Timers** (Flink's batch timer service): a key's timers fire when its input
ends, all of them, in timestamp order, as if the watermark jumped to +infinity
(``EventTime``: ``handleExpiredTimer`` sees watermark
:data:`~dstl_client.processor.layout.MAX_MS`) or the input's end were the end
of time (``ProcessingTime``: every processing-time timer fires too, as Flink
fires them at the end of a key). A timer registered while the key's timers
fire is dropped, as Flink quiesces its timer service then (no endless loop at
the end of a key); the runner counts and logs them. Input handlers see the
watermark ``-1`` (no event time has passed: every timer is in the future).

**Time**: the processing time is one instant for the whole run (given, or the
clock when the runner starts): TTL'd values do not expire within a key's run
(and a key's state ends with its run anyway).

Thread: one task's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from dstl_client.bounded.backend import SingleKeyBackend, as_keyed_backend
from dstl_client.processor.api import ExpiredTimerInfo, TimerValues, time_mode_of
from dstl_client.processor.layout import MAX_MS
from dstl_client.processor.runtime import Emit, ProcessorRuntime, drain
from dstl_client.processor.times import NO_TIME, BatchTimes
from dstl_client.state.api import KeyedContext
from dstl_client.state.subtask import KeyedFunction

log = logging.getLogger(__name__)

#: ``ctx.batch_id`` in sorted mode: the bounded input is one batch
BOUNDED_BATCH_ID = 0


@dataclass(slots=True)
class SortedStats:
    """What one sorted run did (the runner's thread)."""

    keys: int = 0
    #: input rows (``fn`` API: the rows passed; processor: counted by the caller)
    rows: int = 0
    #: state writes
    changes: int = 0
    timers_fired: int = 0
    #: timers registered while the key's timers fired (dropped, as Flink does)
    timers_dropped: int = 0
    #: the most state rows a key held when it ended
    max_key_state_rows: int = 0


def _drain(out: Iterable[Any] | None, emit: Emit | None) -> None:
    if out is None:
        return
    if emit is None:
        for _ in out:
            pass
    else:
        for item in out:
            emit(item)


class SortedKeyedRunner:
    """``fn(key, rows, ctx)`` once per key, state of the current key only.

    Invariant: keys strictly increase (else :class:`~.backend.KeyOrderError`).
    Thread: one task's.
    """

    def __init__(
        self, fn: KeyedFunction, *, emit: Emit | None = None, check_order: bool = True
    ) -> None:
        self.fn = fn
        self.emit = emit
        self.backend = SingleKeyBackend(check_order=check_order)
        self.context = KeyedContext(as_keyed_backend(self.backend), BOUNDED_BATCH_ID)
        self.stats = SortedStats()

    def process(self, key: Any, rows: list[Any]) -> None:
        """The whole input of ``key``: ``fn`` runs once, then the key's state is dropped."""
        backend = self.backend
        backend.start_key(key)
        self.stats.rows += len(rows)
        try:
            _drain(self.fn(key, rows, self.context), self.emit)
        finally:
            backend.end_key()

    def finish(self) -> SortedStats:
        s = self.stats
        s.keys = self.backend.keys
        s.changes = self.backend.changes
        s.max_key_state_rows = self.backend.max_rows
        return s


def run_sorted(
    groups: Iterable[tuple[Any, list[Any]]],
    fn: KeyedFunction,
    *,
    emit: Emit | None = None,
    check_order: bool = True,
) -> SortedStats:
    """Run ``fn`` over ``(key, rows)`` groups in key order; outputs go to ``emit``."""
    runner = SortedKeyedRunner(fn, emit=emit, check_order=check_order)
    for key, rows in groups:
        runner.process(key, rows)
    return runner.finish()


class SortedProcessorRunner:
    """A ``StatefulProcessor`` one key at a time (see the module for timers and time).

    Call :meth:`open` (``init``), :meth:`process` once per key in key order,
    :meth:`close`. Invariant: the key is the runner's (the backend refuses a
    switch). Thread: one task's.
    """

    def __init__(
        self,
        processor: Any,
        *,
        time_mode: str = "None",
        processing_ms: int | None = None,
        emit: Emit | None = None,
        check_order: bool = True,
    ) -> None:
        mode = time_mode_of(time_mode)
        if processing_ms is None:
            processing_ms = int(time.time() * 1000)
        self.processor = processor
        self.time_mode = mode
        self.emit = emit
        self.backend = SingleKeyBackend(check_order=check_order)
        times = BatchTimes(processing_ms=processing_ms, watermark_ms=NO_TIME)
        self.runtime = ProcessorRuntime(
            as_keyed_backend(self.backend), time_mode=mode, times=times, key_of=self._key_of
        )
        #: what input and initial-state handlers see
        self.values = self.runtime.timer_values
        #: what handleExpiredTimer sees at the end of a key
        self.end_values = (
            TimerValues(processing_ms, MAX_MS)
            if mode == "EventTime"
            else TimerValues(self.values.getCurrentProcessingTimeInMs(), NO_TIME)
        )
        self.stats = SortedStats()
        self._warned = False

    def _key_of(self, data: bytes) -> Any:
        """The runtime's key decoder: only the current key has state here."""
        if data != self.backend.current_key_bytes:
            raise AssertionError("a single-key backend holds the current key's rows only")
        return self.backend.current_key

    @property
    def handle(self) -> Any:
        """The processor's ``StatefulProcessorHandle``."""
        return self.runtime.handle

    def open(self) -> None:
        self.processor.init(self.runtime.handle)

    def process(
        self, key: Any, rows: Iterator[Any] | None = None, initial: Iterable[Any] = ()
    ) -> None:
        """Key ``key``: ``handleInitialState`` per item of ``initial``, ``handleInputRows``
        (if ``rows`` is given), then the key's timers; then its state is dropped."""
        backend = self.backend
        runtime = self.runtime
        backend.start_key(key)
        try:
            grouping = runtime.enter_key(key)
            values = self.values
            for item in initial:
                self.processor.handleInitialState(grouping, item, values)
            if rows is not None:
                drain(self.processor.handleInputRows(grouping, rows, values), self.emit)
            if self.time_mode != "None":
                self._fire_timers(grouping)
        finally:
            runtime.leave_key()
            backend.end_key()

    def _fire_timers(self, grouping: tuple[Any, ...]) -> None:
        """Every timer of the current key, in timestamp order; those registered meanwhile
        are dropped (Flink's quiesced timer service at the end of a key)."""
        timers = self.runtime.timers
        due = list(timers.listed())
        if not due:
            return
        values = self.end_values
        processor = self.processor
        for ms in due:
            if not timers.exists(ms):  # deleted by an earlier handler of this pass
                continue
            drain(processor.handleExpiredTimer(grouping, values, ExpiredTimerInfo(ms)), self.emit)
            timers.delete(ms)  # as in Spark: removed once its handler has run
            self.stats.timers_fired += 1
        left = list(timers.listed())
        if left:
            self.stats.timers_dropped += len(left)
            if not self._warned:
                self._warned = True
                log.warning(
                    "sorted mode: key %r registered timer(s) %s while its timers fired at the "
                    "end of its input; dropped (as Flink's batch mode does), further ones "
                    "are counted only",
                    grouping[0],
                    left[:5],
                )

    def close(self) -> SortedStats:
        self.processor.close()
        s = self.stats
        s.keys = self.backend.keys
        s.changes = self.backend.changes
        s.max_key_state_rows = self.backend.max_rows
        return s


def _merge_by_key(
    groups: Iterable[tuple[Any, Any]], initial: Iterable[tuple[Any, Iterable[Any]]]
) -> Iterator[tuple[Any, Any, Iterable[Any]]]:
    """``(key, rows or None, initial items)`` from two key-ordered streams."""
    none: tuple[Any, ...] = ()
    gi = iter(groups)
    ii = iter(initial)
    g = next(gi, None)
    i = next(ii, None)
    while g is not None or i is not None:
        if i is None or (g is not None and g[0] < i[0]):
            assert g is not None
            yield g[0], g[1], none
            g = next(gi, None)
        elif g is None or i[0] < g[0]:
            yield i[0], None, i[1]
            i = next(ii, None)
        else:
            yield g[0], g[1], i[1]
            g = next(gi, None)
            i = next(ii, None)


def run_sorted_processor(
    processor: Any,
    groups: Iterable[tuple[Any, Iterator[Any]]],
    *,
    time_mode: str = "None",
    processing_ms: int | None = None,
    emit: Emit | None = None,
    initial: Iterable[tuple[Any, Iterable[Any]]] = (),
    check_order: bool = True,
) -> SortedStats:
    """Run ``processor`` over ``(key, rows)`` groups in key order (``rows`` what
    ``handleInputRows`` gets); ``initial``: ``(key, items)`` in key order too."""
    runner = SortedProcessorRunner(
        processor,
        time_mode=time_mode,
        processing_ms=processing_ms,
        emit=emit,
        check_order=check_order,
    )
    runner.open()
    for key, rows, items in _merge_by_key(groups, initial):
        runner.process(key, rows, items)
    return runner.close()
