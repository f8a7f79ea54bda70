"""Sticky writer failure and request sizes, against real sidecar processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dstl_client.client import REQUEST_MARGIN_BYTES, ChangelogClient, ChangelogWriter
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


def test_batch_bytes_must_leave_room_below_the_message_limit() -> None:
    with pytest.raises(ConfigError, match="batch_bytes"):
        ChangelogClient("127.0.0.1:1", batch_bytes=64 * MiB)
    with pytest.raises(ConfigError, match="batch_bytes"):
        ChangelogClient("127.0.0.1:1", batch_bytes=MiB, max_message_bytes=MiB)
    with pytest.raises(ConfigError, match="batch_bytes"):
        ChangelogClient("127.0.0.1:1", batch_bytes=0)
    ChangelogClient("127.0.0.1:1", batch_bytes=MiB, max_message_bytes=MiB + REQUEST_MARGIN_BYTES)


def test_no_request_outgrows_the_message_limit(sidecar: ServerProcess) -> None:
    # 140 KiB changes, a 150 KiB batch and a 256 KiB message limit: two changes
    # in one request would be refused by gRPC; the buffer goes out before that
    limit = 256 * KiB
    with ChangelogClient(sidecar.address, batch_bytes=150 * KiB, max_message_bytes=limit) as c:
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
    sidecar: ServerProcess,
) -> None:
    # A client that thinks changes may be 8 MiB (a stale limit, as when a
    # writer is reopened by log id): the sidecar refuses the carried change.
    client = ChangelogClient(sidecar.address, batch_bytes=16 * MiB)
    created = client.create_writer(job_id="stale", operator_id="op", key_group_range=(0, 7))
    w = ChangelogWriter(client, "stale", created.log_id, (0, 7), 8 * MiB)
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


def test_an_unknown_outcome_fails_the_writer_and_close_still_works(tmp_path: Path) -> None:
    with ServerProcess(tmp_path) as proc, ChangelogClient(proc.address) as client:
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
    tmp_path: Path,
) -> None:
    with ServerProcess(tmp_path) as proc:
        client = ChangelogClient(proc.address)
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
