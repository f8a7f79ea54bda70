"""Sidecar crashes (SIGKILL) and clean shutdowns (SIGTERM) of a real ``dstl-server``."""

from __future__ import annotations

import signal
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from dstl_client import ChangelogClient, ChangelogHandle
from dstl_client.core.errors import DstlError, LogNotFound, SidecarUnavailable, WriterFailed
from dstl_server.testing import ServerProcess
from tests.integration._helpers import object_files, poll_until, read_all, temp_files

JOB = "job-restart"


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


@pytest.mark.slow
def test_kill_9_then_restart_on_same_storage(tmp_path: Path, transport: str) -> None:
    """Whatever the transport: a call in flight fails, acknowledged handles stay readable."""
    root = tmp_path / "srv"
    acknowledged: list[tuple[ChangelogHandle, list[tuple[int, int, bytes]]]] = []
    # A long persist delay: JOB's persists flush at once because all its writers
    # wait, while another job's persist stays queued until the crash.
    with ServerProcess(root, extra_args=["--persist-delay-ms", "60000"]) as first:
        address = first.address
        client = ChangelogClient(address, timeout_s=10, transport=transport)
        try:
            writers = [
                client.create_writer(job_id=JOB, operator_id=f"op{i}", key_group_range=(0, 15))
                for i in range(3)
            ]
            pending_job = [
                client.create_writer(
                    job_id="job-pending", operator_id=f"op{i}", key_group_range=(0, 0)
                )
                for i in range(2)
            ]
            first_epoch = client.server_epoch
            for cp in range(3):
                for i, w in enumerate(writers):
                    for kg in range(0, 16, 3):
                        w.append(kg, bytes([i, cp, kg]) * (100 + kg))
                futures = [w.persist_durably(after=0) for w in writers]
                for f in futures:
                    h = f.result(timeout=30)
                    acknowledged.append((h, read_all(client, h)))
            # Appended after the last acknowledged persist: lost with the crash.
            writers[0].append(1, b"never persisted")
            writers[0].flush()
            pending_job[0].append(0, b"queued, not durable")
            persists = first.scrape_metrics()["dstl_persist_requests_total"]
            in_flight = pending_job[0].persist_durably(after=0)
            poll_until(
                lambda: first.scrape_metrics()["dstl_persist_requests_total"] > persists,
                "the persist reached the sidecar",
            )
            assert not in_flight.done()

            first.kill()
            assert first.proc is not None and first.proc.returncode == -signal.SIGKILL
            # A persist waiting when the sidecar died fails; it never reports success.
            with pytest.raises(SidecarUnavailable):
                in_flight.result(timeout=30)
            assert not list((root / "objects").glob("job-pending/*/*"))

            # While the sidecar is down, calls fail loudly.
            with pytest.raises(SidecarUnavailable) as down:
                writers[0].last_appended_sqn()
            assert address in down.value.message

            with ServerProcess(root, listen=address) as second:
                assert second.address == address
                assert second.epoch != first.epoch
                client.wait_ready(timeout_s=20)
                # The old writer does not silently continue on the new sidecar.
                writers[1].append(2, b"x")  # buffered: reaches the sidecar with flush
                for call in (
                    writers[1].flush,
                    lambda: writers[2].persist_durably(after=0).result(timeout=30),
                ):
                    with pytest.raises(LogNotFound, match="restarted"):
                        call()
                # A writer whose send failed stays failed (sticky), naming the first cause.
                with pytest.raises(WriterFailed) as failed:
                    writers[0].last_appended_sqn()
                assert isinstance(failed.value.cause, SidecarUnavailable)
                with pytest.raises(WriterFailed) as failed:
                    writers[1].truncate(before=0)
                assert isinstance(failed.value.cause, LogNotFound)
                # Every acknowledged handle reads back byte for byte through the new process.
                with ChangelogClient(second.address) as fresh:
                    for h, expected in acknowledged:
                        again = ChangelogHandle.from_bytes(h.to_bytes())
                        assert read_all(fresh, again) == expected
                        assert read_all(client, again) == expected
                # A recreated writer works, and starts over.
                w = client.create_writer(job_id=JOB, operator_id="op0", key_group_range=(0, 15))
                assert client.server_epoch not in (None, first_epoch)
                w.append(3, b"after restart")
                h = w.persist_durably(after=0).result(timeout=30)
                assert read_all(client, h) == [(3, 0, b"after restart")]
                assert not temp_files(root)
        finally:
            client.close()


@pytest.mark.slow
def test_sigterm_with_persists_in_flight(tmp_path: Path) -> None:
    """SIGTERM: in-flight persists complete, the process exits 0, no temp files remain."""
    root = tmp_path / "srv"
    writers_n = 6
    # A long persist delay keeps the persists queued when SIGTERM arrives; one
    # idle writer keeps the "every writer waits" trigger from flushing early.
    args = ["--persist-delay-ms", "30000", "--shutdown-grace-s", "20"]
    with ServerProcess(root, extra_args=args) as proc:
        with ChangelogClient(proc.address) as client:
            writers = [
                client.create_writer(job_id=JOB, operator_id=f"op{i}", key_group_range=(0, 3))
                for i in range(writers_n + 1)
            ]
            for i, w in enumerate(writers[:writers_n]):
                for kg in range(4):
                    w.append(kg, f"w{i}-kg{kg}".encode() * 2000)
            persists = proc.scrape_metrics()["dstl_persist_requests_total"]
            futures: list[Future[ChangelogHandle]] = [
                w.persist_durably(after=0) for w in writers[:writers_n]
            ]
            poll_until(
                lambda: (
                    proc.scrape_metrics()["dstl_persist_requests_total"] >= persists + writers_n
                ),
                "the persist RPCs reached the sidecar",
            )
            assert not any(f.done() for f in futures), "persists finished before SIGTERM"
            started = time.monotonic()
            assert proc.stop(timeout_s=30) == 0
            # The shutdown flushed the queue instead of waiting out the delay.
            assert time.monotonic() - started < 15
            handles = []
            for f in futures:
                try:
                    handles.append(f.result(timeout=10))
                except DstlError as exc:  # failing cleanly is allowed, hanging is not
                    pytest.fail(f"in-flight persist failed on clean shutdown: {exc!r}")
        assert not temp_files(root)
        assert len(object_files(root)) == 1  # the queued persists went out as one object

    # Everything acknowledged on the way down is durable: read it via a new sidecar.
    with ServerProcess(root) as again, ChangelogClient(again.address) as client:
        for i, h in enumerate(handles):
            assert [(kg, d) for kg, _, d in read_all(client, h)] == [
                (kg, f"w{i}-kg{kg}".encode() * 2000) for kg in range(4)
            ]
