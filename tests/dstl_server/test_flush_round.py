"""The flush waits for the round: a job's scheduler past the persist delay, on virtual time.

Persists reach the sidecar spread over more than the persist delay when many
writers take part (64 writers over ~20 ms on two cores). The scheduler knows
who persisted in the previous round (:class:`RoundMembers`) and keeps waiting
for them past the delay, up to its maximum wait. Every test runs its
scheduler on a :class:`FakeClock`: the arrivals are placed in virtual time
and the flush times are exact, with no sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from dstl_server.batching import BatchingScheduler
from dstl_server.flush_round import FORGET_AFTER_MISSES, RoundMembers
from dstl_server.log import WriterLog
from dstl_server.metrics import ServerMetrics
from dstl_server.registry import LogRegistry
from dstl_server.upload_task import UploadTask
from tests.dstl_server._helpers import make_task, scheduler
from tests.fakes import FakeClock, MemoryUploader, batch, registry, sample, settle

DELAY_S = 0.010
MAX_WAIT_S = 0.040


class TimedUploader(MemoryUploader):
    """Records the virtual time of each upload (a flush starts its upload at once)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.times: list[float] = []

    async def upload(self, job_id: str, data: bytes) -> str:
        self.times.append(self.clock.now)
        return await super().upload(job_id, data)


class Job:
    """One job's scheduler on virtual time, its writers, and the rounds they persist in."""

    def __init__(self, writers: int, *, open_writers: int | None = None) -> None:
        self.clock = FakeClock()
        self.up = TimedUploader(self.clock)
        self.metrics = ServerMetrics()
        self.logs = [WriterLog("job", f"op{i}", (i, i)) for i in range(writers)]
        n = writers if open_writers is None else open_writers
        self.sch: BatchingScheduler = scheduler(
            self.up,
            writers=lambda: n,
            delay_s=DELAY_S,
            max_wait_s=MAX_WAIT_S,
            sleep=self.clock.sleep,
            metrics=self.metrics,
        )

    async def round(self, offsets_s: list[float], who: list[int] | None = None) -> list[float]:
        """Writers ``who`` (default: all) persist at ``offsets_s`` after now, in that
        order; each persist's latency, once every one is complete."""
        who = list(range(len(offsets_s))) if who is None else who
        start = self.clock.now
        submitted: list[float] = []
        done: dict[int, float] = {}
        tasks: list[UploadTask] = []

        def completed(i: int) -> Callable[[object], None]:
            return lambda _: done.__setitem__(i, self.clock.now)

        for i, (w, at) in enumerate(zip(who, offsets_s, strict=True)):
            await self.clock.sleep(start + at - self.clock.now)
            t = make_task(self.logs[w], f"writer {w}".encode())
            t.future.add_done_callback(completed(i))
            submitted.append(self.clock.now)
            self.sch.submit(t)
            tasks.append(t)
        await asyncio.wait_for(asyncio.gather(*(t.future for t in tasks)), 5)
        return [done[i] - submitted[i] for i in range(len(tasks))]

    def flushes(self, trigger: str) -> float:
        return sample(self.metrics, "dstl_flushes_total", trigger=trigger)


def spread(writers: int, over_s: float) -> list[float]:
    return [over_s * i / (writers - 1) for i in range(writers)]


@pytest.mark.asyncio
async def test_64_writers_spread_past_the_delay_make_one_object_per_round() -> None:
    job = Job(64)
    await job.round(spread(64, 0.020))  # the first round learns who takes part
    learned = job.up.calls
    assert learned == 2  # without members to wait for: split at the delay, as before
    for r in range(5):
        await job.clock.sleep(0.100)
        latencies = await job.round(spread(64, 0.020))
        assert job.up.calls == learned + r + 1  # one object per round
        assert max(latencies) == pytest.approx(0.020)  # the first waited for the last
        assert min(latencies) == pytest.approx(0.0)  # the last flushed it at once
    assert job.flushes("all_waiting") == 5 and job.flushes("max_wait") == 0


@pytest.mark.asyncio
async def test_an_idle_open_writer_does_not_stop_the_round_flush() -> None:
    # 64 writers persist every round, a 65th is open but never persists: the round
    # still leaves when its last expected writer arrives (trigger "round")
    job = Job(64, open_writers=65)
    await job.round(spread(64, 0.020))
    for _ in range(3):
        await job.clock.sleep(0.100)
        latencies = await job.round(spread(64, 0.020))
        assert max(latencies) == pytest.approx(0.020)
    assert job.flushes("round") == 3 and job.flushes("all_waiting") == 0


@pytest.mark.asyncio
async def test_one_writer_flushes_at_once() -> None:
    job = Job(1)
    for _ in range(3):
        assert await job.round([0.0]) == [0.0]
        await job.clock.sleep(0.100)
    assert job.flushes("all_waiting") == 3


@pytest.mark.asyncio
async def test_eight_writers_within_the_delay_flush_with_the_last() -> None:
    job = Job(8)
    for _ in range(3):
        latencies = await job.round(spread(8, 0.004))
        assert max(latencies) == pytest.approx(0.004) and job.up.calls == len(job.up.times)
        await job.clock.sleep(0.100)
    assert job.up.calls == 3 and job.flushes("all_waiting") == 3


@pytest.mark.asyncio
async def test_a_writer_that_stops_persisting_holds_the_round_until_max_wait_then_is_forgotten() -> (
    None
):
    job = Job(2, open_writers=2)
    await job.round([0.0, 0.001])
    latencies = []
    for _ in range(FORGET_AFTER_MISSES + 2):
        await job.clock.sleep(0.100)
        latencies += await job.round([0.0], who=[0])  # writer 1 never persists again
    assert latencies == pytest.approx(
        [MAX_WAIT_S] * FORGET_AFTER_MISSES + [DELAY_S] * 2
    )  # waited for it up to the maximum, twice; then only the delay (it is still open)
    assert job.flushes("max_wait") == FORGET_AFTER_MISSES
    assert job.flushes("delay") == 2


@pytest.mark.asyncio
async def test_a_round_past_max_wait_leaves_then_its_stragglers_wait_only_the_delay() -> None:
    job = Job(4)
    await job.round([0.0, 0.001, 0.002, 0.003])
    await job.clock.sleep(0.100)
    # writer 3 is 60 ms late: the round leaves at the maximum wait without it, and its
    # persist completes that round (nobody else owes it), after the delay at most
    latencies = await job.round([0.0, 0.001, 0.002, 0.060])
    assert latencies == pytest.approx([MAX_WAIT_S, MAX_WAIT_S - 0.001, MAX_WAIT_S - 0.002, DELAY_S])
    assert job.flushes("max_wait") == 1 and job.flushes("delay") == 1
    await job.clock.sleep(0.100)
    latencies = await job.round([0.0, 0.015, 0.016, 0.020])  # the next round: one object
    assert max(latencies) == pytest.approx(0.020)
    assert job.up.calls == 1 + 2 + 1


@pytest.mark.asyncio
async def test_a_closed_writer_is_not_waited_for() -> None:
    job = Job(3, open_writers=3)
    await job.round([0.0, 0.001, 0.002])
    job.logs[2].close()  # its count of open writers is the registry's: still 3 here
    await job.clock.sleep(0.100)
    assert await job.round([0.0, 0.001]) == pytest.approx([DELAY_S, DELAY_S - 0.001])
    assert job.flushes("delay") == 1 and job.flushes("max_wait") == 0


@pytest.mark.asyncio
async def test_without_max_wait_past_the_delay_the_flush_leaves_at_the_delay() -> None:
    clock = FakeClock()
    up = TimedUploader(clock)
    sch = scheduler(up, writers=2, delay_s=DELAY_S, max_wait_s=DELAY_S, sleep=clock.sleep)
    logs = [WriterLog("job", f"op{i}", (i, i)) for i in range(2)]
    for wl in logs:
        sch.submit(make_task(wl, b"learn"))
    await settle()
    t = make_task(logs[0], b"alone")
    sch.submit(t)
    await asyncio.wait_for(t.future, 5)
    assert up.times[-1] - up.times[0] == pytest.approx(DELAY_S)


def test_round_members_owing_and_forgetting() -> None:
    class W:
        closed = False

    members = RoundMembers(max_writers=2, max_children=1)
    a, b, c = W(), W(), W()
    members.writer_arrives("a", a)
    members.writer_arrives("b", b)
    members.writer_arrives("c", c)  # over the bound: never tracked
    members.child_arrives("x")
    members.child_arrives("y")  # over the bound
    assert len(members) == 3 and members.children == {"x"}
    assert not members.missing()  # newcomers owe nothing in their first round
    members.writer_arrives("a", a)  # a's next round begins: the others owe theirs
    assert members.owing() == {("w", "b"), ("c", "x")}
    members.child_arrives("x")
    members.writer_arrives("b", b)
    assert not members.missing()
    members.writer_arrives("b", b)
    b.closed = True
    assert members.owing() == {("w", "a"), ("c", "x")}
    for _ in range(FORGET_AFTER_MISSES):
        members.waited()
    assert not members.missing() and len(members) == 1  # x and a forgotten, b kept


@pytest.mark.asyncio
async def test_a_persist_with_nothing_new_counts_as_arrived() -> None:
    # before: the writer with nothing to upload never reached the scheduler, so its
    # job's flush waited for the delay (a minute here) instead of leaving at once
    up = MemoryUploader()
    reg: LogRegistry = registry(up, persist_delay_ms=60_000.0)
    w1 = reg.create_writer("job", "op-1", (0, 3))
    w2 = reg.create_writer("job", "op-2", (0, 3))
    await reg.append(w1.log_id, batch((0, [b"x"])))
    handles = await asyncio.wait_for(
        asyncio.gather(reg.persist(w1.log_id, after=0), reg.persist(w2.log_id, after=0)), 5
    )
    assert [len(h.entries) for h in handles] == [1, 0]
    assert sample(reg.metrics, "dstl_flushes_total", trigger="all_waiting") == 1
