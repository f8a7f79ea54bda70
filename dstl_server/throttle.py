"""The one bound on change bytes the sidecar holds in memory (``max_in_flight_bytes``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator

from dstl_client.core.errors import Backpressure, BudgetFull

#: calls refused at once call ``on_pressure`` at most this often (it walks every writer)
PRESSURE_INTERVAL_S = 0.05
#: writers remembered as pushed back, at most, before stale entries are dropped
_PUSHED_BACK_KEPT = 4096
#: a Session stream let in to read holds its share of the room this long at most: a
#: request already queued on the stream arrives well within it (loopback), an idle
#: stream gives the room back to the next one
READ_TURN_S = 0.05
#: while streams wait for room, what waits for upload is pushed out this often (an
#: upload that failed in an outage is tried again, as a refused call would ask)
WAIT_PRESSURE_S = 0.25


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop (a synchronous caller)
        return None


class _Hold:
    """The bytes one admitted call holds, until its append takes them over.

    Only the task that made it takes from it: a task it starts (an upload
    scheduled during the append) inherits the context variable, not the hold.
    """

    __slots__ = ("left", "owner")

    def __init__(self, nbytes: int) -> None:
        self.left = nbytes
        self.owner = _current_task()

    def mine(self) -> int:
        """Bytes left to the current task (0 for any other task)."""
        return self.left if self.owner is _current_task() else 0


#: the hold of the call the current task runs (set by ``MemoryBudget.admitted``)
_CURRENT_HOLD: contextvars.ContextVar[_Hold | None] = contextvars.ContextVar(
    "dstl_budget_hold", default=None
)


class ReadTurn:
    """A Session stream's leave to read its next request, and the room it holds for it.

    Made by :meth:`MemoryBudget.read_turn_now` or
    :meth:`MemoryBudget.wait_read_turn`; ``granted`` is False when the
    wait ran out (the stream reads anyway, once). :meth:`done` gives the room
    back (the request was admitted, or carried no changes); it also gives
    itself back :data:`READ_TURN_S` after it was granted, whichever comes
    first, so an idle stream never holds room. Idempotent; event-loop only.
    """

    __slots__ = ("_budget", "_timer", "future", "granted", "reserved")

    def __init__(self, budget: MemoryBudget, reserved: int) -> None:
        self._budget = budget
        self.reserved = reserved
        self.granted = False
        self.future: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def _grant(self) -> None:
        """Hold ``reserved`` bytes of room for a while (budget-internal)."""
        self.granted = True
        self._budget.reading += self.reserved
        self._timer = asyncio.get_running_loop().call_later(READ_TURN_S, self.done)

    def done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.reserved and self.granted:
            self._budget.reading -= self.reserved
            self.reserved = 0
            self._budget._wake()


class MemoryBudget:
    """Counts every change byte the node holds, over every writer: the one count.

    Two parts, one limit (``limit`` = ``max_in_flight_bytes``):

    * ``used`` -- bytes appended and not yet uploaded, as charged (data plus
      per-part overhead) by appends and forwarded sections, until an upload,
      a truncate or a close releases them (``dstl_unuploaded_bytes``);
    * ``held`` -- bytes of calls that carry changes, admitted and not yet
      appended: a call waiting for an earlier call of its writer (parked) or
      in the middle of its turn.

    Invariant: ``used + held`` (``total``) grows only through a call admitted
    while ``total < limit``, so it never exceeds ``limit`` by more than one
    request (one request may overcommit, as Flink's UploadThrottle allows,
    so a change larger than the headroom never deadlocks). A call that finds
    ``total >= limit`` is refused at once with :class:`BudgetFull`
    (``RESOURCE_EXHAUSTED``, nothing applied: the client sends it again with
    backoff); nothing waits here holding its request. A writer refused for
    ``timeout_s`` without an admission in between gets a plain
    :class:`Backpressure` instead (the store is too slow or down: its
    caller fails the writer). Every refusal asks ``on_pressure`` (at most
    every :data:`PRESSURE_INTERVAL_S`) to upload what waits, so memory frees
    up. ``on_change`` gets ``used`` after every change.

    **Reading only what fits.** A request is in memory as soon as it is
    read, before any refusal, so a Session stream takes a turn
    (:meth:`read_turn_now`, else :meth:`wait_read_turn`) before it reads its
    next request: streams are let in, first come first served, while
    ``total + reading < limit``, each holding room for the request it
    expects (the size of its last one; the whole budget for its first) in
    ``reading`` until its request is admitted or :data:`READ_TURN_S` passes
    (:class:`ReadTurn`); the others wait, their requests held on the client
    by HTTP/2 flow control. When nothing is held for readers, one is always
    let in (one request may overcommit, as above).

    Event-loop only (the hold of the running call travels in a context
    variable of the task that runs it).
    """

    def __init__(
        self,
        limit: int,
        timeout_s: float,
        on_pressure: Callable[[], None],
        on_change: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.used = 0
        self.held = 0
        self._on_pressure = on_pressure
        self._on_change = on_change
        self._clock = clock
        self._last_pressure = -PRESSURE_INTERVAL_S
        #: writer -> when it was first refused since its last admission
        self._pushed_back: dict[str, float] = {}
        #: room held for Session streams let in to read (see ReadTurn)
        self.reading = 0
        #: streams waiting for room to read, first come first served
        self._readers: collections.deque[ReadTurn] = collections.deque()

    @property
    def total(self) -> int:
        return self.used + self.held

    @property
    def over(self) -> bool:
        """No room: for a call admitted by :meth:`admitted`, not counting its own hold."""
        hold = _CURRENT_HOLD.get()
        own = hold.mine() if hold is not None else 0
        return self.used + self.held - own >= self.limit

    @property
    def has_room(self) -> bool:
        """Whether a call would be admitted now (one not yet admitted: no hold of its own)."""
        return self.used + self.held < self.limit

    # ------------------------------------------------------------ admission
    def check_room(self, who: str) -> None:
        """Refuse ``who``'s call unless there is room (:class:`BudgetFull` / :class:`Backpressure`)."""
        if self.used + self.held < self.limit:
            if who:
                self._pushed_back.pop(who, None)
            return
        now = self._clock()
        self._pressure(now)
        state = f"{self.used + self.held} bytes are held (limit {self.limit})"
        if who:
            since = self._pushed_back.setdefault(who, now)
            if now - since >= self.timeout_s:
                del self._pushed_back[who]
                raise Backpressure(
                    f"{state} and writer {who} was pushed back for {now - since:.1f}s "
                    f"(backpressure_timeout_s={self.timeout_s:g}): the store is too slow or down"
                )
            if len(self._pushed_back) > _PUSHED_BACK_KEPT:
                self._forget_stale(now)
        raise BudgetFull(f"{state}: nothing was applied; send the call again after a pause")

    @contextlib.contextmanager
    def admitted(self, nbytes: int, who: str) -> Iterator[None]:
        """Hold ``nbytes`` for the body (a call that carries changes), if there is room.

        Raises as :meth:`check_room` when there is none. An append inside the
        body (:meth:`take` / :meth:`acquire`, same task) turns the hold into
        ``used``; what is left is released when the body ends, however.
        """
        self.check_room(who)
        hold = _Hold(nbytes)
        self.held += nbytes
        token = _CURRENT_HOLD.set(hold)
        try:
            yield
        finally:
            _CURRENT_HOLD.reset(token)
            self.held -= hold.left
            if hold.left:
                hold.left = 0
                self._wake()

    # ------------------------------------------------------------ reading
    def read_turn_now(self, expected: int) -> ReadTurn | None:
        """A Session stream's turn to read a request of about ``expected`` bytes, if readers
        fit and none waits."""
        if self._readers or not self._fits():
            return None
        turn = ReadTurn(self, max(1, expected))
        turn._grant()
        return turn

    async def wait_read_turn(self, who: str, expected: int) -> ReadTurn:
        """Wait in line for a Session stream of ``who`` to read (see the class doc).

        Waits at most what is left of ``who``'s ``timeout_s`` of being pushed
        back (its clock starts now if it is not running: a request may be
        queued on the stream); then the turn is not ``granted`` and the
        stream reads anyway (what it reads goes through the usual admission).
        ``""`` (a stream not bound to a writer yet) waits ``timeout_s``.
        Call :meth:`ReadTurn.done` once the request read is admitted or
        carries no changes, and :meth:`forget` when it came long after the
        wait (the stream was idle: its writer was not pushed back).
        Cancelling the wait leaves the line.
        """
        turn = ReadTurn(self, max(1, expected))
        now = self._clock()
        since = self._pushed_back.setdefault(who, now) if who else now
        turn.future = asyncio.get_running_loop().create_future()
        self._readers.append(turn)
        if not self.has_room:  # full, not only held for readers: upload what waits
            self._pressure(now)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, self.timeout_s - (now - since))
        try:
            while not turn.granted and (left := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(asyncio.shield(turn.future), min(left, WAIT_PRESSURE_S))
                except TimeoutError:  # still no room: uploads that failed are tried again
                    if not self.has_room:
                        self._pressure(self._clock())
        except BaseException:
            turn.done()  # cancelled: give back the room it may have been granted
            raise
        finally:
            if not turn.granted:
                with contextlib.suppress(ValueError):
                    self._readers.remove(turn)
        return turn

    def _fits(self) -> bool:
        """Room for one more reader: below the limit, with what readers already hold."""
        return self.used + self.held + self.reading < self.limit

    def _wake(self) -> None:
        """Let waiting readers in, in order, while they fit."""
        readers = self._readers
        while readers and self._fits():
            turn = readers.popleft()
            assert turn.future is not None
            turn._grant()
            turn.future.set_result(None)

    def forget(self, who: str) -> None:
        """``who`` was not pushed back after all (its stream was idle while it waited)."""
        self._pushed_back.pop(who, None)

    def _pressure(self, now: float) -> None:
        """Ask for uploads of what waits (at most every PRESSURE_INTERVAL_S)."""
        if now - self._last_pressure >= PRESSURE_INTERVAL_S:
            self._last_pressure = now
            self._on_pressure()

    def _forget_stale(self, now: float) -> None:
        horizon = 2 * self.timeout_s
        for who in [w for w, t in self._pushed_back.items() if now - t > horizon]:
            del self._pushed_back[who]

    # ------------------------------------------------------------ accounting
    async def acquire(self, nbytes: int) -> bool:
        """Account ``nbytes`` (an append or forwarded sections); never waits.

        A call admitted by :meth:`admitted` takes what it holds; one that
        was not is refused at once when there is no room (as
        :meth:`check_room` without a writer). Returns False (it never waited;
        kept for callers that count waits).
        """
        hold = _CURRENT_HOLD.get()
        if hold is None or not hold.mine():
            self.check_room("")
        self.take(nbytes)
        return False

    def take(self, nbytes: int) -> None:
        """Account ``nbytes`` now; first out of the current call's hold, if it has one."""
        hold = _CURRENT_HOLD.get()
        if hold is not None and hold.mine():
            moved = min(hold.left, nbytes)
            hold.left -= moved
            self.held -= moved
        self._add(nbytes)

    def release(self, nbytes: int) -> None:
        if nbytes:
            self._add(-nbytes)
            if self._readers:
                self._wake()

    def _add(self, nbytes: int) -> None:
        self.used += nbytes
        if self._on_change is not None:
            self._on_change(self.used)
