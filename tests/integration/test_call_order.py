"""Changes appended after persist_durably() was called are not in its handle."""

from __future__ import annotations

from pathlib import Path

from dstl_client import ChangelogClient
from dstl_server.testing import ServerProcess


def test_appends_made_while_a_persist_is_in_flight_stay_out_of_its_handle(
    tmp_path: Path, transport: str
) -> None:
    # A long persist delay keeps the persist in flight while we append more.
    with (
        ServerProcess(tmp_path, extra_args=["--persist-delay-ms", "300"]) as proc,
        ChangelogClient(proc.address, transport=transport) as client,
    ):
        w = client.create_writer(job_id="order", operator_id="op", key_group_range=(0, 3))
        for i in range(100):
            w.append(key_group=i % 4, data=b"before-%d" % i)
        pending = w.persist_durably(after=0)  # carries the buffered changes
        for i in range(100):
            w.append(key_group=i % 4, data=b"after-%d" % i)
        w.flush()  # an Append RPC racing the in-flight persist
        first = pending.result(timeout=30)
        got = sorted(data for _, _, data in client.read_changes(first))
        assert got == sorted(b"before-%d" % i for i in range(100))

        second = w.persist_durably(after=first.to_sqn).result(timeout=30)
        got2 = sorted(data for _, _, data in client.read_changes(second))
        assert got2 == sorted(b"after-%d" % i for i in range(100))
        w.close()
