"""The materialization slot of a store: one claim at a time, released by the OS on death."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dstl_client.checkpoint.messages import MatResult
from dstl_client.state.mat_slot import (
    DONE,
    RECORD_NAME,
    RUNNING,
    MaterializationSlot,
    MatOutcome,
    SlotRecord,
)


def test_one_claim_at_a_time_until_released(tmp_path: Path) -> None:
    slot = MaterializationSlot(tmp_path)
    first = slot.claim()
    assert first is not None
    # a second open of the lock file conflicts, also in the same process
    assert slot.claim() is None
    first.release()
    first.release()  # once only: a second release is a no-op
    again = slot.claim()
    assert again is not None
    again.release()


def test_a_claim_is_released_when_its_process_is_killed(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from dstl_client.state.mat_slot import MaterializationSlot, SlotRecord, RUNNING\n"
        "slot = MaterializationSlot(Path(sys.argv[1]))\n"
        "claim = slot.claim()\n"
        "assert claim is not None\n"
        "slot.write(SlotRecord(5, RUNNING))\n"
        "print('claimed', flush=True)\n"
        "sys.stdin.read()\n"
    )
    # Popen's context manager kills nothing: the test kills it, and on failure the
    # closed stdin ends it (it reads stdin to its end)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "claimed"
        slot = MaterializationSlot(tmp_path)
        assert slot.claim() is None  # it runs
        proc.kill()
        proc.wait(timeout=30)
        claim = slot.claim()
        assert claim is not None  # released by the OS
        # the record still says running: the materialization died
        assert slot.read() == SlotRecord(5, RUNNING)
        claim.release()


def test_records_round_trip_and_a_bad_one_is_dropped(tmp_path: Path) -> None:
    slot = MaterializationSlot(tmp_path)
    assert slot.read() is None
    outcome = MatOutcome(
        batch=3,
        result=MatResult(3, None, (), (1, 2), False),
        seconds=0.5,
        bytes=10,
        kgs=0,
        dirty_kgs=2,
    )
    slot.write(SlotRecord(3, DONE, outcome, round_id="r1"))
    assert slot.read() == SlotRecord(3, DONE, outcome, round_id="r1")
    # a record from before rounds had ids reads as one of no round
    (tmp_path / RECORD_NAME).write_bytes(b'{"batch": 3, "status": "running"}')
    assert slot.read() == SlotRecord(3, RUNNING, round_id="")
    (tmp_path / RECORD_NAME).write_bytes(b'{"batch": 3, "status": "exploded"}')
    assert slot.read() is None
    assert not (tmp_path / RECORD_NAME).exists()
    (tmp_path / RECORD_NAME).write_bytes(b"\x00not json")
    assert slot.read() is None
    slot.clear()  # nothing to clear: no error
