"""One client's unary calls that carry changes: a bounded window, one while pushed back.

The sidecar has a unary request in memory as soon as gRPC has received it,
before it can refuse it for a full memory budget, and a client with many
writers could send one large request per writer at once. So every unary
call that carries changes, a first send or a resend, takes its turn at the
client's :class:`ResendGate`: its requests in flight hold at most
:data:`UNARY_WINDOW_BYTES` together (one request at least, whatever its
size), and while any call of the client is pushed back (refused with
:class:`~dstl_client.core.errors.BudgetFull` and not yet settled) one call
at a time, in line. A call holds its turn until it settles; a persist,
whose answer waits for its upload, at most :data:`PROBE_HOLD_S` (that it
was not refused at once is what counts). A refused call waits its jittered
pause (:func:`dstl_client.transport.retry_delay`) and gets in line again:
the first writer back probes the budget, the others wait on the client,
holding nothing on the sidecar.

Session streams need no gate: the sidecar does not read a stream's next
request while its budget cannot take it, so a waiting request stays on the
client under HTTP/2 flow control.

Thread-safe: writers' threads, gRPC callback and timer threads call it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

#: bytes of unary requests with changes one client has in flight at once (at least one
#: request; one request at a time while pushed back)
UNARY_WINDOW_BYTES = 16 << 20
#: a persist holds its turn until it settles, or this long at most
PROBE_HOLD_S = 0.1


class GatePass:
    """One call's way through the gate (made per call, used by one thread at a time).

    ``hold_s``: how long its turn lasts at most (None: until it settles, for
    a call answered as soon as it is applied, like an append).
    """

    __slots__ = ("hold_s", "pushed_back")

    def __init__(self, hold_s: float | None = None) -> None:
        self.hold_s = hold_s
        #: refused for a full budget and not settled since
        self.pushed_back = False


class ResendGate:
    """See the module docs.

    Invariants: ``pushed_back`` counts the passes refused and not settled;
    ``_holders`` maps the passes whose calls are out to when their turn
    ends at the latest and their request's bytes; a call gets a turn when
    it is first in line (or nobody waits) and fits: no holder at all while
    ``pushed_back``, else nothing held or ``window`` bytes with its own.
    """

    def __init__(
        self, window: int = UNARY_WINDOW_BYTES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self._clock = clock
        self._cond = threading.Condition()
        self.pushed_back = 0
        self._line: deque[GatePass] = deque()
        self._holders: dict[GatePass, tuple[float, int]] = {}
        self._held_bytes = 0

    def enter(self, p: GatePass, nbytes: int, deadline: float) -> bool:
        """Wait until ``p``'s call (a request of ``nbytes``) may be sent; False if
        ``deadline`` (monotonic) passes first."""
        with self._cond:
            now = self._clock()
            if not self._line and self._fits(nbytes, now):
                self._take(p, nbytes, now)
                return True
            self._line.append(p)
            try:
                while True:
                    if self._line[0] is p and self._fits(nbytes, now):
                        self._take(p, nbytes, now)
                        return True
                    if now >= deadline:
                        return False
                    ends = [until for until, _ in self._holders.values()]
                    self._cond.wait(max(0.001, min([deadline, *ends]) - now))
                    now = self._clock()
            finally:
                self._line.remove(p)
                self._cond.notify_all()  # the next in line may go

    def _fits(self, nbytes: int, now: float) -> bool:
        for q in [q for q, (until, _) in self._holders.items() if until <= now]:
            self._drop(q)  # its turn ran out: it was not refused at once
        if not self._holders:
            return True
        return not self.pushed_back and self._held_bytes + nbytes <= self.window

    def _take(self, p: GatePass, nbytes: int, now: float) -> None:
        until = math.inf if p.hold_s is None else now + p.hold_s
        self._holders[p] = (until, nbytes)
        self._held_bytes += nbytes

    def _drop(self, p: GatePass) -> None:
        held = self._holders.pop(p, None)
        if held is not None:
            self._held_bytes -= held[1]

    def refused(self, p: GatePass) -> None:
        """``p``'s call was refused for a full budget (it will be sent again, or give up)."""
        with self._cond:
            if not p.pushed_back:
                p.pushed_back = True
                self.pushed_back += 1
            self._drop(p)
            self._cond.notify_all()

    def settled(self, p: GatePass) -> None:
        """``p``'s call has its outcome (accepted, another error, given up): it leaves."""
        with self._cond:
            if p.pushed_back:
                p.pushed_back = False
                self.pushed_back -= 1
            self._drop(p)
            self._cond.notify_all()
