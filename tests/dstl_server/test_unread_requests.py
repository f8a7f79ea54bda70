"""A writer's request that arrives while the memory budget is full is refused unread.

It was sent while there was room (a Session stream's read was already
waiting, or a unary call was on its way); by the time it arrives the budget
is full. The sidecar refuses it with ``BudgetFull`` without decoding it,
nothing is applied and the writer is not failed: the client sends it again
after a pause and, once the budget has room, it is applied in its place.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dstl_client import ChangelogClient
from dstl_server.testing import running_server
from tests.fakes import sample

LIMIT = 1 << 20
KG = (0, 3)


async def until(predicate: object, what: str, timeout_s: float = 10.0) -> None:
    assert callable(predicate)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["stream", "unary"])
async def test_a_request_arriving_while_the_budget_is_full_is_refused_unread_and_resent(
    tmp_path: Path, transport: str
) -> None:
    async with running_server(
        tmp_path, max_in_flight_bytes=LIMIT, batch_size_threshold=LIMIT
    ) as server:
        client = ChangelogClient(server.address, transport=transport)
        try:
            w = await asyncio.to_thread(
                client.create_writer, job_id="j", operator_id="o", key_group_range=KG
            )
            await asyncio.to_thread(w.append, 0, b"first")
            await asyncio.to_thread(w.flush)  # applied
            metrics = server.registry.metrics
            budget = server.registry.budget
            if transport == "stream":  # it reads on (room), then gives the room back: idle
                await until(lambda: budget.reading > 0, "the stream reading its next request")
                await until(lambda: budget.reading == 0, "the idle stream's turn ending")
            budget.take(LIMIT)  # full meanwhile (e.g. uploads the store does not take)

            second = b"second" * 1000

            def send() -> None:
                w.append(1, second)
                w.flush()

            sending = asyncio.ensure_future(asyncio.to_thread(send))
            await until(
                lambda: sample(metrics, "dstl_errors_total", kind="budget_full") >= 1,
                "the request refused for the full budget",
            )
            assert budget.held == 0  # refused unread: it holds nothing
            assert not sending.done()  # the client waits and sends it again
            await asyncio.sleep(0.2)
            assert not sending.done()
            budget.release(LIMIT)  # room again
            await asyncio.wait_for(sending, 30)

            handle = await asyncio.to_thread(lambda: w.persist_durably(after=0).result(30))
            got = await asyncio.to_thread(
                lambda: sorted((kg, data) for kg, _sqn, data in client.read_changes(handle))
            )
            assert got == [(0, b"first"), (1, second)]
            assert w.failed is None
            assert sample(metrics, "dstl_sessions_failed_total") == 0
        finally:
            client.close()
