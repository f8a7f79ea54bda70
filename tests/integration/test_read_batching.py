"""ReadChanges in batched messages (what the client asks for) and one changeset per
message (older clients): the same changesets in the same order, within the limits."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from dstl_client import ChangelogClient
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.handle import ChangelogHandle
from dstl_server.testing import ServerProcess
from tests.integration._helpers import raw_stub

MiB = 1 << 20
KiB = 1 << 10
LIMIT = 4 * MiB  # --max-request-bytes: the message limit both ways

Row = tuple[int, int, int, bytes, bytes]


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batching") / "srv"
    args = ["--max-request-bytes", str(LIMIT), "--max-change-bytes", str(MiB)]
    with ServerProcess(root, extra_args=args) as p:
        yield p


def persisted(proc: ServerProcess, per_kg: list[list[bytes]]) -> ChangelogHandle:
    with ChangelogClient(proc.address, timeout_s=30, max_message_bytes=LIMIT) as client:
        w = client.create_writer(job_id="j", operator_id="op", key_group_range=(0, 63))
        for kg, changes in enumerate(per_kg):
            for data in changes:
                w.append(kg, data)
        return w.persist_durably(after=0).result(timeout=60)


def raw_read(proc: ServerProcess, handle: ChangelogHandle, batched: bool) -> list[list[Row]]:
    """The changesets of each message of one ReadChanges call."""
    channel, stub = raw_stub(proc.address)
    try:
        req = pb.ReadChangesRequest(handle=handle.to_proto(), batched=batched)
        out: list[list[Row]] = []
        for msg in stub.ReadChanges(req, timeout=30):
            if batched:
                assert not msg.payload and not msg.sizes and not msg.count
                out.append(
                    [(c.key_group, c.sqn, c.count, c.sizes, c.payload) for c in msg.changesets]
                )
            else:
                assert not msg.changesets
                out.append([(msg.key_group, msg.sqn, msg.count, msg.sizes, msg.payload)])
        return out
    finally:
        channel.close()


def test_many_small_changesets_come_in_one_message_when_batched(proc: ServerProcess) -> None:
    handle = persisted(proc, [[f"kg{kg}-{i}".encode() for i in range(3)] for kg in range(64)])
    single = raw_read(proc, handle, batched=False)
    batched = raw_read(proc, handle, batched=True)
    assert len(single) == 64 and all(len(m) == 1 for m in single)
    assert len(batched) == 1
    assert batched[0] == [row for m in single for row in m]


def test_batches_stay_near_a_mebibyte_and_a_large_changeset_goes_in_pieces(
    proc: ServerProcess,
) -> None:
    # 64 key groups of 48 KiB (3 MiB: several batches), then one of 6 MiB (over the limit)
    per_kg = [[secrets.token_bytes(16 * KiB) for _ in range(3)] for _ in range(63)]
    per_kg.append([secrets.token_bytes(512 * KiB) for _ in range(12)])
    handle = persisted(proc, per_kg)
    single = raw_read(proc, handle, batched=False)
    batched = raw_read(proc, handle, batched=True)
    assert [row for m in batched for row in m] == [row for m in single for row in m]
    sizes = [sum(len(r[3]) + len(r[4]) for r in m) for m in batched]
    assert len(batched) >= 4 and all(s < LIMIT for s in sizes), sizes
    assert all(s <= MiB for s, m in zip(sizes, batched, strict=True) if len(m) > 1), sizes
    with ChangelogClient(proc.address, timeout_s=30, max_message_bytes=LIMIT) as client:
        got = [(kg, d) for kg, _, d in client.read_changes(handle)]
    assert got == [(kg, d) for kg, changes in enumerate(per_kg) for d in changes]


def test_every_message_fits_the_receive_limit_the_caller_names(proc: ServerProcess) -> None:
    per_kg = [[secrets.token_bytes(16 * KiB) for _ in range(3)] for _ in range(63)]
    per_kg.append([secrets.token_bytes(100 * KiB) for _ in range(12)])
    handle = persisted(proc, per_kg)
    limit = 256 * KiB
    channel, stub = raw_stub(proc.address)
    try:
        for batched in (True, False):
            req = pb.ReadChangesRequest(
                handle=handle.to_proto(), batched=batched, max_message_bytes=limit
            )
            sizes = [msg.ByteSize() for msg in stub.ReadChanges(req, timeout=30)]
            assert max(sizes) <= limit, (batched, max(sizes))
    finally:
        channel.close()
    # the client names its own limit: a 256 KiB client reads it all
    with ChangelogClient(
        proc.address, timeout_s=30, max_message_bytes=limit, batch_bytes=64 * KiB
    ) as client:
        got = [(kg, d) for kg, _, d in client.read_changes(handle)]
    assert got == [(kg, d) for kg, changes in enumerate(per_kg) for d in changes]
