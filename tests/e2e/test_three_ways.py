"""Issue 20 item 4: the count-and-sum job three ways on the same input — Spark's
``transformWithStateInPandas`` (RocksDB), dstl's ``transform_with_state`` and dstl's
vectorized ``transform_batches`` — gives the same rows, batch by batch; and so do the
dstl engines after a sidecar kill, a driver kill and a rescale 2 → 3. An event-time job
with timers (and late rows) gives the same rows three ways too.

Spark runs the count-and-sum job once for the module (:func:`by_spark`);
every dstl run is compared with it. The runs share one Spark session and one
sidecar (which the sidecar-kill variant kills and starts again on the same
address and storage). The jobs: :mod:`tests.e2e._three_ways_jobs`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_server.testing import ServerProcess
from tests.e2e._harness import run_driver
from tests.e2e._three_ways import (
    ENGINES,
    read_outputs,
    run_to_end,
    spark_outputs,
    start,
    write_input,
)
from tests.e2e._three_ways_jobs import COUNT_SUM, IDLE, Job, Outputs, expected_sums

BATCHES = len(COUNT_SUM.batches)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


class Sidecar:
    """One ``dstl-server`` for the module that a test may crash and start again on the
    same address and storage (:meth:`restart`). Thread: any, one call at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = ServerProcess(root).start()
        self.restarts = 0

    @property
    def address(self) -> str:
        return self.proc.address

    def restart(self) -> None:
        """SIGKILL (a crash: nothing flushed), then a new process on the same address."""
        address, epoch = self.proc.address, self.proc.epoch
        self.proc.kill()
        self.proc = ServerProcess(self.root, listen=address).start()
        assert self.proc.epoch != epoch
        self.restarts += 1

    def stop(self) -> None:
        self.proc.__exit__(None, None, None)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    proc = Sidecar(tmp_path_factory.mktemp("sidecar"))
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def of_spark(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[Job], Outputs]:
    """A job's output per batch on Spark's own ``transformWithStateInPandas`` (RocksDB);
    each job runs once for the module."""
    runs: dict[str, Outputs] = {}

    def outputs(job: Job) -> Outputs:
        if job.name not in runs:
            runs[job.name] = spark_outputs(spark, job, tmp_path_factory.mktemp(job.name))
        return runs[job.name]

    return outputs


@pytest.fixture(scope="module")
def by_spark(of_spark: Callable[[Job], Outputs]) -> Outputs:
    """Spark's output of the count-and-sum job."""
    got = of_spark(COUNT_SUM)
    assert got == expected_sums()  # one batch per file, and the job's own arithmetic
    return got


def test_the_same_job_three_ways_gives_the_same_output_batch_by_batch(
    spark: Any, sidecar: Sidecar, by_spark: Outputs, tmp_path: Path
) -> None:
    got = {}
    for engine in ENGINES:
        tmp = tmp_path / engine
        write_input(tmp / "input", COUNT_SUM, range(BATCHES))
        run_to_end(start(spark, engine, tmp, sidecar.address))
        got[engine] = read_outputs(tmp / "out")
    assert got == {engine: by_spark for engine in ENGINES}


def test_event_time_timers_and_late_rows_three_ways_give_the_same_output(
    spark: Any, sidecar: Sidecar, of_spark: Callable[[Job], Outputs], tmp_path: Path
) -> None:
    """The idle-key job: a timer per key on the watermark, late rows dropped."""
    want = of_spark(IDLE)
    # Spark fired the timers planned (key 2 without input) and dropped the late 1@30
    fired = {b: sorted(r[0] for r in rows if r[1] == "idle") for b, rows in want.items()}
    assert fired == {0: [], 1: [], 2: [2], 3: [1, 4]}
    assert {r[0] for r in want[3] if r[1] == "update"} == {2, 8}
    got = {}
    for engine in ENGINES:
        tmp = tmp_path / engine
        write_input(tmp / "input", IDLE, range(len(IDLE.batches)))
        run_to_end(start(spark, engine, tmp, sidecar.address, job=IDLE))
        got[engine] = read_outputs(tmp / "out")
    assert got == {engine: want for engine in ENGINES}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_sidecar_killed_mid_run_keeps_the_output_equal_to_sparks(
    spark: Any, sidecar: Sidecar, by_spark: Outputs, tmp_path: Path, engine: str
) -> None:
    """SIGKILL of the sidecar once batch 2 is planned, a new one on the same address and
    storage: batch 2's tasks find their changelogs gone and start new ones."""
    write_input(tmp_path / "input", COUNT_SUM, range(BATCHES))
    restarts = sidecar.restarts

    def on_phase(phase: str, batch_id: int) -> None:
        if (phase, batch_id) == ("planned", 2):
            sidecar.restart()

    query = start(spark, engine, tmp_path, sidecar.address, on_phase=on_phase)
    run_to_end(query)
    assert sidecar.restarts == restarts + 1
    # batches 2 and 3 persisted their changes through the new process
    assert sidecar.proc.scrape_metrics()["dstl_persist_requests_total"] > 0
    assert read_outputs(tmp_path / "out") == by_spark


def test_a_driver_killed_after_the_tasks_of_a_batch_resumes_to_sparks_output(
    spark: Any, sidecar: Sidecar, by_spark: Outputs, tmp_path: Path
) -> None:
    """A driver process running the job on both dstl engines dies by SIGKILL after batch 2's
    tasks ran and its output reached the sink, before its checkpoint; another driver (this
    one) on another node (an empty state directory) re-runs batch 2 from the checkpoint of
    batch 1, then batch 3."""
    for engine in ENGINES:
        write_input(tmp_path / engine / "input", COUNT_SUM, range(BATCHES))
    options = {
        "tmp": tmp_path,
        "address": sidecar.address,
        "state-dir": tmp_path / "node-a",
        "crash": "tasks_done:2",
    }
    assert run_driver("tests.e2e._three_ways", options) == -signal.SIGKILL
    got, restored = {}, {}
    for engine in ENGINES:
        tmp = tmp_path / engine
        assert sorted(read_outputs(tmp / "out")) == [0, 1, 2], engine
        query = start(spark, engine, tmp, sidecar.address, state_dir=tmp_path / "node-b" / engine)
        run_to_end(query)
        got[engine] = read_outputs(tmp / "out")
        restored[engine] = {h.batch_id: h.restored_subtasks for h in query.history}[2]
    # both subtasks of each job rebuilt their key groups from the checkpoint of batch 1
    assert restored == {engine: 2 for engine in ENGINES}
    assert got == {engine: by_spark for engine in ENGINES}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("job", [COUNT_SUM, IDLE], ids=lambda job: job.name)
def test_a_rescale_from_2_to_3_keeps_the_output_equal_to_sparks(
    spark: Any,
    sidecar: Sidecar,
    of_spark: Callable[[Job], Outputs],
    tmp_path: Path,
    engine: str,
    job: Job,
) -> None:
    """Batches 0-1 with parallelism 2; stopped; batches 2-3 with parallelism 3 (the idle
    job's timers and watermark restored too: its batch 2 fires a timer set in batch 1)."""
    write_input(tmp_path / "input", job, range(2))
    run_to_end(start(spark, engine, tmp_path, sidecar.address, job=job, parallelism=2))
    write_input(tmp_path / "input", job, range(2, len(job.batches)))
    query = start(spark, engine, tmp_path, sidecar.address, job=job, parallelism=3)
    run_to_end(query)
    restored = {h.batch_id: h.restored_subtasks for h in query.history}
    assert restored[2] == 3  # every subtask of the new parallelism restored its key groups
    assert read_outputs(tmp_path / "out") == of_spark(job)
