"""The sidecar's hot path: what it counts once, encodes early or builds in one step.

Each shortcut must give exactly what the long way gives: the same charged
bytes, the same changeset sizes, the same object bytes, the same answer.
"""

from __future__ import annotations

import asyncio

import pytest

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import SqnOutOfRange
from dstl_client.core.format import (
    Changeset,
    build_object,
    encode_log_section,
    pack_changes,
    parse_object,
)
from dstl_client.core.handle import ChangelogHandle, HandleEntry
from dstl_server import batching as uploads_mod
from dstl_server.handle_size import check_travels
from dstl_server.log import PART_OVERHEAD_BYTES, WriterLog
from dstl_server.registry import LogRegistry
from dstl_server.throttle import MemoryBudget
from dstl_server.upload_task import UploadTask
from tests.dstl_server._helpers import check_entry, make_task, scheduler
from tests.fakes import MemoryUploader, registry


def test_budget_take_counts_like_acquire() -> None:
    seen: list[int] = []
    budget = MemoryBudget(100, 1.0, lambda: None, on_change=seen.append)
    budget.take(40)
    budget.take(70)  # overcommit is allowed, as for one acquire past the limit
    assert budget.used == 110 and budget.over and seen == [40, 110]
    budget.release(110)
    assert budget.used == 0 and not budget.over


def test_append_parts_counts_the_changeset_once() -> None:
    wl = WriterLog("job", "op", (0, 9))
    a, b, c = pack_changes([b"a", b"bb"]), pack_changes([b"ccc"]), pack_changes([b"d" * 10])
    wl.append_parts([(1, a), (2, b)], a.nbytes + b.nbytes)
    wl.append(1, c)
    assert wl.active == {1: [a, c], 2: [b]} and wl.active_parts == 3
    data = a.nbytes + b.nbytes + c.nbytes
    assert wl.active_bytes == data + 3 * PART_OVERHEAD_BYTES
    assert wl.rollover() == 1 and wl.active_parts == 0 and wl.active_bytes == 0
    cs = wl.not_uploaded[0]
    counted = Changeset(cs.sqn, cs.groups)  # counts its parts on first use
    assert (cs.nbytes, cs.nparts) == (counted.nbytes, counted.nparts) == (data, 3)


@pytest.mark.asyncio
async def test_registry_append_fast_and_full_checks_agree() -> None:
    """One-change parts take the fast check, others the full one; both land alike."""
    reg = registry(MemoryUploader())
    wl = reg.create_writer("job", "op", (0, 9))
    parts = [
        pb.KeyGroupChanges(key_group=kg, count=p.count, sizes=p.sizes, payload=p.payload)
        for kg, p in ((3, pack_changes([b"one"])), (4, pack_changes([b"x", b"yy", b""])))
    ]
    assert await reg.append(wl.log_id, parts) == 0
    assert [(kg, [(p.count, p.sizes, p.payload) for p in ps]) for kg, ps in wl.active.items()] == [
        (3, [(1, parts[0].sizes, b"one")]),
        (4, [(3, parts[1].sizes, b"xyy")]),
    ]
    data = sum(len(p.sizes) + len(p.payload) for p in parts)
    assert reg.budget.used == wl.active_bytes == data + 2 * PART_OVERHEAD_BYTES


@pytest.mark.asyncio
async def test_small_sections_are_encoded_when_queued() -> None:
    up = MemoryUploader()
    sch = scheduler(up, writers=2)
    small = make_task(WriterLog("job", "a", (0, 0)), b"small")
    big_payload = b"B" * (uploads_mod._EARLY_ENCODE_BYTES + 1)
    big = make_task(WriterLog("job", "b", (0, 0)), big_payload)
    sch.submit(small)
    assert small.encoded  # while the flush waits for the other writer
    expected = encode_log_section(small.log.log_id_bytes, small.changesets, small.end_sqn)
    assert small.encode() == expected
    sch.submit(big)  # the second writer: the flush; the large section is encoded there
    assert not big.encoded
    e_small, e_big = await asyncio.wait_for(asyncio.gather(small.future, big.future), 5)
    assert check_entry(up, small, e_small) == b"small"
    assert check_entry(up, big, e_big) == big_payload
    # the object is byte for byte what encoding everything at the flush gives
    sections = [
        encode_log_section(t.log.log_id_bytes, t.changesets, t.end_sqn) for t in (small, big)
    ]
    assert up.objects[e_small.object_key] == build_object(sections).data
    assert len(parse_object(up.objects[e_small.object_key]).sections) == 2


@pytest.mark.asyncio
async def test_no_early_encoding_for_preemptive_sections_or_a_large_next_object() -> None:
    up = MemoryUploader()
    sch = scheduler(up, writers=100, threshold=1 << 30)
    pre = make_task(WriterLog("job", "p", (0, 0)), b"pre", preemptive=True)
    sch.submit(pre)
    assert not pre.encoded  # pressure relief starts many at once: encoded at the flush
    chunk = b"c" * uploads_mod._EARLY_ENCODE_BYTES
    fill = [make_task(WriterLog("job", f"f{i}", (0, 0)), chunk[:-64]) for i in range(17)]
    for t in fill:
        sch.submit(t)
    assert sch.queued_bytes > uploads_mod._INLINE_BUILD_BYTES
    assert all(t.encoded for t in fill[:16]) and not fill[16].encoded
    sch.flush("test")
    for t in [pre, *fill]:
        entry = await asyncio.wait_for(t.future, 5)
        assert check_entry(up, t, entry) == (b"pre" if t is pre else chunk[:-64])


@pytest.mark.asyncio
async def test_large_flush_is_encoded_and_built_in_one_thread_hop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hops: list[str] = []
    real = asyncio.to_thread

    async def counting(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        hops.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    up = MemoryUploader()
    sch = scheduler(up, writers=1)
    payload = b"L" * (uploads_mod._INLINE_ENCODE_BYTES + 1)
    task = make_task(WriterLog("job", "op", (0, 0)), payload)
    sch.submit(task)
    entry = await asyncio.wait_for(task.future, 5)
    assert hops == ["_encode_and_build"]
    assert check_entry(up, task, entry) == payload


def _registry() -> LogRegistry:
    """The registry that answers persists, for the service and the stream alike."""
    return registry(MemoryUploader())


def _handle(entries: int, key: str = "job/00/" + "k" * 36 + ".dstl") -> ChangelogHandle:
    return ChangelogHandle(
        "job",
        "ab" * 16,
        (0, 127),
        3,
        3 + entries,
        tuple(HandleEntry(key, 10 * i, 10, 3 + i, 4 + i) for i in range(entries)),
    )


def test_a_handle_that_fits_in_a_message_travels() -> None:
    reg = _registry()
    for n in (0, 1, 5):
        check_travels(_handle(n), reg.max_response_bytes)  # no error


def test_a_handle_too_large_for_a_message_is_refused() -> None:
    reg = _registry()
    handle = _handle(40)
    size = pb.PersistResponse(handle=handle.to_proto()).ByteSize()
    reg.max_response_bytes = size  # fits exactly: the bound says maybe, the check says yes
    check_travels(handle, reg.max_response_bytes)
    reg.max_response_bytes = size - 1
    with pytest.raises(SqnOutOfRange, match="more than a message may carry"):
        check_travels(handle, reg.max_response_bytes)


def test_upload_task_counts_its_bytes_once() -> None:
    loop = asyncio.new_event_loop()
    try:
        cs = Changeset(0, {1: [pack_changes([b"abc"])]})
        task = UploadTask(WriterLog("job", "op", (1, 1)), [cs], False, loop.create_future())
        assert task.nbytes == cs.nbytes == 7
        cs.groups[1].append(pack_changes([b"zz"]))  # type: ignore[attr-defined]
        assert task.nbytes == 7  # counted once: a task's changesets are closed
    finally:
        loop.close()
