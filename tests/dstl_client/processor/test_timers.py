"""Timers in the keyed state, against a real sidecar: order, delete, fire once, restore, rescale."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.client import ChangelogClient
from dstl_client.core.errors import InvalidArgument
from dstl_client.processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from dstl_server.testing import ServerProcess
from tests.dstl_client.processor._harness import ProcessorHarness, coordinator


class Timers(StatefulProcessor):
    """Rows say which timers of their key to register or delete; fired timers are output.

    A fired timer of ``"again"`` registers one for a time already due: it fires
    in the next batch, not in the same pass.
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.fired = handle.getValueState("fired", "n long")

    def handleInputRows(
        self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[Any]:
        for row in rows:
            for ms in row.get("register", ()):
                self.handle.registerTimer(ms)
            for ms in row.get("delete", ()):
                self.handle.deleteTimer(ms)
        yield ("timers", key[0], tuple(self.handle.listTimers()))

    def handleExpiredTimer(
        self, key: tuple[Any, ...], timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        ms = expiredTimerInfo.getExpiryTimeInMs()
        n = (self.fired.get() or (0,))[0] + 1
        self.fired.update((n,))
        if key[0] == "again" and n == 1:
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 5)
        yield ("fired", key[0], ms, n)


def fired(outputs: list[Any]) -> list[tuple[str, int]]:
    return [(o[1], o[2]) for o in outputs if o[0] == "fired"]


def harness(tmp: Path, sidecar: ServerProcess, client: ChangelogClient, job: str, **kw: Any) -> Any:
    return ProcessorHarness(coordinator(tmp, sidecar.address, job), Timers, client, **kw)


KEYS = [f"key-{i}" for i in range(40)]


def test_due_timers_fire_in_time_order_once_also_for_keys_without_input(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    h = harness(tmp_path, sidecar, client, "order", parallelism=1)
    # batch 0 at t=1000: every key registers two timers; one is deleted again
    rows = [{"k": k, "register": [1080 + i, 5000 + i]} for i, k in enumerate(KEYS)]
    rows += [{"k": "key-3", "delete": [1083]}, {"k": "again", "register": [1100]}]
    run = h.run_batch(0, rows)
    assert run is not None and not fired(run.outputs)
    assert ("timers", "key-3", (5003,)) in run.outputs
    # batch 1 at t=1100: timers up to 1100 fire in time order (a tie by key), keys with no
    # input included; "again" registers one for 1095, due already: it fires next batch
    run = h.run_batch(1, [{"k": "key-30"}])
    assert run is not None
    want = [(f"key-{i}", 1080 + i) for i in range(20) if i != 3]
    want += [("again", 1100), ("key-20", 1100)]
    assert fired(run.outputs) == want
    assert run.stats.timers_fired == len(want)
    # batch 2 at t=1200: the rest of the first timers and "again"'s second, once each
    run = h.run_batch(2, [])
    assert run is not None
    assert fired(run.outputs) == [("again", 1095)] + [(f"key-{i}", 1080 + i) for i in range(21, 40)]
    run = h.run_batch(3, [{"k": "key-3"}])
    assert run is not None and not fired(run.outputs)
    assert ("timers", "key-3", (5003,)) in run.outputs
    h.coordinator.close()


def test_timers_survive_a_lost_disk_a_rescale_and_a_rerun_batch(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    h = harness(tmp_path, sidecar, client, "restore", parallelism=2)
    rows = [{"k": k, "register": [1050 + i, 1250 + i]} for i, k in enumerate(KEYS)]
    assert h.run_batch(0, rows) is not None
    # the node lost its disk, and the job comes back with 3 subtasks: restored from the checkpoint
    shutil.rmtree(tmp_path / "state")
    h.parallelism = 3
    # batch 1 runs, its timers fire, but the driver dies before its record: batch 1 is re-run
    first = h.run_tasks(1, [])
    assert first is not None
    assert all(r.stats.restored for r in first.results)
    rerun = h.run_batch(1, [])
    assert rerun is not None
    assert sorted(fired(rerun.outputs)) == sorted(fired(first.outputs))
    assert sorted(fired(rerun.outputs)) == sorted((k, 1050 + i) for i, k in enumerate(KEYS))
    assert {o[3] for o in rerun.outputs} == {1}  # the failed attempt's counts were not kept
    # back to 1 subtask: the second timers fire once, the first ones never again
    h.parallelism = 1
    run = h.run_batch(2, [])
    assert run is not None and not fired(run.outputs)
    run = h.run_batch(3, [])
    assert run is not None
    assert sorted(fired(run.outputs)) == sorted((k, 1250 + i) for i, k in enumerate(KEYS))
    assert {o[3] for o in run.outputs} == {2}
    assert run.stats.state_rows == len(KEYS)  # the "fired" counts; no timer rows left
    h.coordinator.close()


def test_timers_need_a_time_mode_and_a_key(
    tmp_path: Path, sidecar: ServerProcess, client: ChangelogClient
) -> None:
    h = harness(tmp_path, sidecar, client, "nomode", time_mode="None", parallelism=1)
    with pytest.raises(InvalidArgument, match="time mode"):
        h.run_batch(0, [{"k": "a", "register": [5]}])

    class InInit(Timers):
        def init(self, handle: StatefulProcessorHandle) -> None:
            super().init(handle)
            handle.registerTimer(5)

    h = harness(tmp_path, sidecar, client, "ininit", parallelism=1)
    h.make = InInit
    with pytest.raises(InvalidArgument, match="belong to a key"):
        h.run_batch(0, [])
    h.coordinator.close()
