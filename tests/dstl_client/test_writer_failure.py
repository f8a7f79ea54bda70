"""Sticky writer failure and request sizes, against real sidecar processes.

Every test that sends writer calls runs once per client transport (unary
calls, the Session stream).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client.client import REQUEST_MARGIN_BYTES, ChangelogClient
from dstl_client.core.errors import (
    ChangeTooLarge,
    ConfigError,
    DstlError,
    SidecarUnavailable,
    SqnOutOfRange,
    WriterFailed,
)
from dstl_server.testing import ServerProcess

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture
def client(sidecar: ServerProcess, transport: str) -> Iterator[ChangelogClient]:
    with ChangelogClient(sidecar.address, transport=transport) as c:
        c.wait_ready()
        yield c


def test_batch_bytes_must_leave_room_below_the_message_limit() -> None:
    with pytest.raises(ConfigError, match="batch_bytes"):
        ChangelogClient("127.0.0.1:1", batch_bytes=64 * MiB)
    with pytest.raises(ConfigError, match="batch_bytes"):
        ChangelogClient("127.0.0.1:1", batch_bytes=MiB, max_message_bytes=MiB)
    with pytest.raises(ConfigError, match="batch_bytes"):
        ChangelogClient("127.0.0.1:1", batch_bytes=0)
    ChangelogClient("127.0.0.1:1", batch_bytes=MiB, max_message_bytes=MiB + REQUEST_MARGIN_BYTES)


def test_no_request_outgrows_the_message_limit(sidecar: ServerProcess, transport: str) -> None:
    # 140 KiB changes, a 150 KiB batch and a 256 KiB message limit: two changes
    # in one request would be refused by gRPC; the buffer goes out before that
    limit = 256 * KiB
    with ChangelogClient(
        sidecar.address, batch_bytes=150 * KiB, max_message_bytes=limit, transport=transport
    ) as c:
        w = c.create_writer(job_id="sizes", operator_id="op", key_group_range=(0, 63))
        assert w.max_change_bytes < limit - REQUEST_MARGIN_BYTES
        with pytest.raises(ChangeTooLarge):
            w.append(0, b"x" * (limit - REQUEST_MARGIN_BYTES))
        expected = [(kg, bytes([kg]) * 140 * KiB) for kg in range(10)]
        for kg, data in expected[:5]:
            w.append(kg, data)
        w.append_many(expected[5:])
        handle = w.persist_durably(after=0).result(timeout=10)
        got = sorted((kg, data) for kg, _sqn, data in c.read_changes(handle))
        assert got == expected
        assert w.failed is None
        w.close()


def test_refusals_that_lose_nothing_do_not_fail_the_writer(client: ChangelogClient) -> None:
    w = client.create_writer(job_id="refusals", operator_id="op", key_group_range=(0, 7))
    w.append(1, b"one")
    sqn = w.last_appended_sqn()
    with pytest.raises(SqnOutOfRange):
        w.truncate(before=sqn + 1000)
    with pytest.raises(SqnOutOfRange):  # a persist carrying no change
        w.persist_durably(after=sqn + 1000).result(timeout=10)
    with pytest.raises(ChangeTooLarge):  # checked before it is buffered
        w.append(3, b"x" * (w.max_change_bytes + 1))
    w.append(2, b"two")
    handle = w.persist_durably(after=0).result(timeout=10)
    assert sorted(d for _kg, _sqn, d in client.read_changes(handle)) == [b"one", b"two"]
    assert w.failed is None
    w.close()


def test_a_persist_after_a_refused_persist_with_changes_gets_no_handle(
    sidecar: ServerProcess, transport: str
) -> None:
    # A client that thinks changes may be 8 MiB (a stale limit, as when a
    # writer is reopened by log id): the sidecar refuses the carried change.
    client = ChangelogClient(sidecar.address, batch_bytes=16 * MiB, transport=transport)
    created = client.create_writer(job_id="stale", operator_id="op", key_group_range=(0, 7))
    w = client.open_writer(
        job_id="stale", log_id=created.log_id, key_group_range=(0, 7), max_change_bytes=8 * MiB
    )
    too_big = b"x" * (created.max_change_bytes + 1)
    w.append(1, too_big)
    first = w.persist_durably(after=0)
    try:  # sent at once, most likely before the first one's answer
        w.append(2, b"small")
        second = w.persist_durably(after=0)
    except WriterFailed:
        second = None
    with pytest.raises(ChangeTooLarge):
        first.result(timeout=10)
    if second is not None:
        with pytest.raises(WriterFailed) as info:
            second.result(timeout=10)
        assert isinstance(info.value.cause, ChangeTooLarge)
    with pytest.raises(WriterFailed):
        w.append(3, b"later")
    w.close()
    client.close()


def test_an_unknown_outcome_fails_the_writer_and_close_still_works(
    tmp_path: Path, transport: str
) -> None:
    with (
        ServerProcess(tmp_path) as proc,
        ChangelogClient(proc.address, transport=transport) as client,
    ):
        w = client.create_writer(job_id="gone", operator_id="op", key_group_range=(0, 7))
        w.append(1, b"one")
        w.flush()
        proc.kill()
        with pytest.raises(SidecarUnavailable):
            w.last_appended_sqn()
        with pytest.raises(WriterFailed) as info:
            w.append(1, b"two")
        assert isinstance(info.value.cause, SidecarUnavailable)
        w.close()  # best effort: the sidecar is gone, nothing is raised


def test_a_cancelled_persist_is_sidecar_unavailable_and_fails_the_writer(
    tmp_path: Path, transport: str
) -> None:
    with ServerProcess(tmp_path) as proc:
        client = ChangelogClient(proc.address, transport=transport)
        w = client.create_writer(job_id="cancel", operator_id="op", key_group_range=(0, 7))
        assert proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGSTOP)  # the call hangs in flight
        try:
            w.append(1, b"carried")
            future = w.persist_durably(after=0)
            client.close()  # cancels the call in flight
            with pytest.raises(DstlError) as info:
                future.result(timeout=10)
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
        assert type(info.value) is SidecarUnavailable, repr(info.value)
        assert "CANCELLED" in info.value.message
        assert isinstance(w.failed, SidecarUnavailable)


def test_an_unknown_transport_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="transport"):
        ChangelogClient("127.0.0.1:1", transport="carrier-pigeon")


def test_a_lost_stream_fails_only_writers_with_a_call_on_it(tmp_path: Path) -> None:
    """A stream that breaks while idle costs nothing: the next call opens a new one.

    Its answer then decides, as for a unary call (here: the sidecar is gone).
    A persist waiting on a stream that breaks fails with SidecarUnavailable, and
    its writer fails for good when it carried changes.
    """
    with (
        ServerProcess(tmp_path, extra_args=["--persist-delay-ms", "60000"]) as proc,
        ChangelogClient(proc.address, transport="stream", timeout_s=10) as client,
    ):
        idle = client.create_writer(job_id="lost", operator_id="idle", key_group_range=(0, 1))
        busy = client.create_writer(job_id="lost", operator_id="busy", key_group_range=(0, 1))
        idle.append(0, b"sent")
        idle.flush()  # its stream is open, and idle from here on
        busy.append(1, b"carried by the persist")
        waiting = busy.persist_durably(after=0)  # held by the 60 s persist delay
        proc.kill()
        with pytest.raises(SidecarUnavailable):
            waiting.result(timeout=10)
        assert isinstance(busy.failed, SidecarUnavailable)
        assert idle.failed is None  # nothing of it was in flight
        with pytest.raises(SidecarUnavailable):
            idle.last_appended_sqn()  # a new stream; the sidecar is gone
        assert isinstance(idle.failed, SidecarUnavailable)
        idle.close()
        busy.close()
