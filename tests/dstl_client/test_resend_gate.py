"""ResendGate: one client's unary calls with changes, a bounded window, one while pushed back."""

from __future__ import annotations

import threading
import time

from dstl_client._resend_gate import GatePass, ResendGate


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def test_requests_in_flight_hold_at_most_the_window_one_at_least() -> None:
    gate = ResendGate(window=100)
    small = [GatePass() for _ in range(10)]
    for p in small:
        assert gate.enter(p, 10, soon())  # ten small requests together
    late = GatePass()
    assert not gate.enter(late, 10, time.monotonic() + 0.05)  # the window is full
    gate.settled(small[0])
    assert gate.enter(late, 10, soon())
    for p in [*small[1:], late]:
        gate.settled(p)
    big = GatePass()
    assert gate.enter(big, 1000, soon())  # larger than the window: alone
    assert not gate.enter(GatePass(), 1, time.monotonic() + 0.05)
    gate.settled(big)


def test_while_a_call_is_pushed_back_one_goes_at_a_time_in_line() -> None:
    gate = ResendGate(window=1000)
    refused = GatePass()
    assert gate.enter(refused, 10, soon())
    gate.refused(refused)  # BudgetFull: it pauses, then gets in line again
    assert gate.pushed_back == 1
    probe = GatePass()
    assert gate.enter(probe, 10, soon())  # the first back probes the budget
    order: list[str] = []

    def send(name: str, p: GatePass) -> None:
        assert gate.enter(p, 10, soon())
        order.append(name)

    second = threading.Thread(target=send, args=("refused", refused))
    second.start()
    time.sleep(0.05)
    third = threading.Thread(target=send, args=("fresh", GatePass()))
    third.start()
    time.sleep(0.05)
    assert order == []  # the probe is out: both wait, holding nothing on the sidecar
    gate.settled(probe)
    second.join(5)
    assert order == ["refused"]  # in line: first come first served
    time.sleep(0.05)
    assert order == ["refused"]
    gate.settled(refused)  # accepted: nobody is pushed back any more
    third.join(5)
    assert order == ["refused", "fresh"]
    assert gate.pushed_back == 0


def test_a_persists_turn_ends_by_itself() -> None:
    """A persist's answer waits for its upload: not refused at once is what counts."""
    gate = ResendGate(window=10)
    persist = GatePass(hold_s=0.05)
    assert gate.enter(persist, 10, soon())
    started = time.monotonic()
    assert gate.enter(GatePass(), 10, soon())  # after the persist's hold ran out
    assert time.monotonic() - started >= 0.04


def test_waiting_is_bounded_by_the_deadline() -> None:
    gate = ResendGate(window=10)
    assert gate.enter(GatePass(), 10, soon())
    started = time.monotonic()
    assert not gate.enter(GatePass(), 10, time.monotonic() + 0.1)
    assert 0.09 <= time.monotonic() - started < 2.0
