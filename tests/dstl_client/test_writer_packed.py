"""``append_packed``: a packed run of changes is the same as appending each change."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstl_client._buffer import PART_FRAMING_BYTES, ChangeBuffer, fit_sizes
from dstl_client.client import REQUEST_MARGIN_BYTES, ChangelogClient
from dstl_client.core.errors import ChangeTooLarge, InvalidArgument, KeyGroupOutOfRange
from dstl_client.core.format import MAX_PARTS_PER_REQUEST
from dstl_server.testing import ServerProcess

KiB = 1 << 10


def _packed(changes: list[bytes]) -> tuple[array[int], bytes]:
    return array("I", map(len, changes)), b"".join(changes)


@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.binary(max_size=9), max_size=6))))
def test_buffer_add_packed_is_add_of_each(runs: list[tuple[int, list[bytes]]]) -> None:
    one, packed = ChangeBuffer((0, 3), 100), ChangeBuffer((0, 3), 100)
    for kg, changes in runs:
        for c in changes:
            one.add(kg, c)
        if changes:
            packed.add_packed(kg, *_packed(changes))
    assert (packed.count, packed.nbytes, packed.framing) == (one.count, one.nbytes, one.framing)
    assert packed.drain() == one.drain()


def test_buffer_keeps_no_reference_to_a_mutable_change() -> None:
    buf = ChangeBuffer((0, 0), 100)
    data = bytearray(b"abc")
    buf.add(0, data)  # type: ignore[arg-type]
    data[0] = ord("x")
    assert buf.drain()[0].payload == b"abc"


@given(st.lists(st.integers(0, 50), max_size=12), st.integers(0, 12), st.integers(0, 300))
def test_fit_takes_the_most_changes_that_fit(sizes: list[int], start: int, free: int) -> None:
    start = min(start, len(sizes))
    end, nbytes = fit_sizes(array("I", sizes), start, free)
    assert start <= end <= len(sizes)
    assert nbytes == sum(sizes[start:end])
    assert nbytes + 4 * (end - start) <= free
    if end < len(sizes):
        assert nbytes + 4 * (end - start) + sizes[end] + 4 > free


def test_packed_runs_read_back_as_appended_ones(sidecar: ServerProcess, transport: str) -> None:
    # a 256 KiB message limit: a run of 5 x 100 KiB is split between requests;
    # small runs and single appends interleave, several key groups
    limit = 256 * KiB
    with ChangelogClient(
        sidecar.address,
        batch_bytes=150 * KiB,
        max_message_bytes=limit + REQUEST_MARGIN_BYTES,
        transport=transport,
    ) as c:
        w = c.create_writer(job_id="packed", operator_id="op", key_group_range=(0, 7))
        expected: list[tuple[int, bytes]] = []
        big = [bytes([i]) * 100 * KiB for i in range(5)]
        w.append_packed(3, *_packed(big))
        expected += [(3, b) for b in big]
        w.append(1, b"single")
        expected.append((1, b"single"))
        small = [bytes([i % 256]) * i for i in range(300)]
        w.append_packed(1, *_packed(small))
        expected += [(1, s) for s in small]
        w.append_packed(5, array("I"), b"")  # an empty run: nothing
        w.append_packed(7, *_packed([b"", b"x"]))
        expected += [(7, b""), (7, b"x")]
        handle = w.persist_durably(after=0).result(timeout=10)
        with ChangelogClient(sidecar.address) as reader:  # read messages may be larger
            got = [(kg, data) for kg, _sqn, data in reader.read_changes(handle)]
        # per key group in append order
        for kg in (1, 3, 7):
            assert [d for g, d in got if g == kg] == [d for g, d in expected if g == kg]
        assert len(got) == len(expected)
        assert w.failed is None
        w.close()


def test_bad_runs_are_refused_before_anything_is_buffered(client: ChangelogClient) -> None:
    w = client.create_writer(job_id="packed", operator_id="op", key_group_range=(0, 7))
    with pytest.raises(InvalidArgument):
        w.append_packed(0, array("I", [3, 3]), b"abcde")
    with pytest.raises(InvalidArgument):
        w.append_packed(0, array("H", [1]), b"a")
    with pytest.raises(KeyGroupOutOfRange):
        w.append_packed(8, *_packed([b"a"]))
    with pytest.raises(KeyGroupOutOfRange):
        w.append_packed(8, array("I"), b"")
    with pytest.raises(ChangeTooLarge):
        w.append_packed(0, *_packed([b"a", b"x" * (w.max_change_bytes + 1)]))
    w.append_packed(2, *_packed([b"ok"]))
    handle = w.persist_durably(after=0).result(timeout=10)
    assert [(kg, d) for kg, _sqn, d in client.read_changes(handle)] == [(2, b"ok")]
    assert w.failed is None
    w.close()


def _per_change_run(
    buf: ChangeBuffer, changes: list[tuple[int, bytes]], limit: int, room: int
) -> int:
    """How many changes ``ChangelogWriter.append``'s rules add before a send: a send
    before change j (the request would outgrow ``room``) ends the run at j, one after it
    (the batch is full) at j + 1."""
    nbytes, framing, count, seen = buf.nbytes, buf.framing, buf.count, set(buf._sizes)
    for j, (kg, data) in enumerate(changes):
        if count and nbytes + framing + len(data) > room:
            return j
        nbytes += len(data) + 4
        count += 1
        if kg not in seen:
            seen.add(kg)
            framing += PART_FRAMING_BYTES
        if nbytes >= limit or len(seen) >= MAX_PARTS_PER_REQUEST:
            return j + 1
    return len(changes)


_changes = st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=40)), max_size=40)


@given(_changes, _changes, st.integers(1, 600), st.integers(60, 600), st.integers(0, 10))
def test_add_run_adds_what_the_per_change_rules_add_before_a_send(
    before: list[tuple[int, bytes]],
    changes: list[tuple[int, bytes]],
    limit: int,
    room: int,
    start: int,
) -> None:
    run, one = ChangeBuffer((0, 5), 40), ChangeBuffer((0, 5), 40)
    for kg, data in before:  # a buffer already holding some changes
        run.add(kg, data)
        one.add(kg, data)
    start = min(start, len(changes))
    columns = run.columns(changes)
    if not changes:
        assert columns is None  # nothing to take
        return
    assert columns is not None
    taken = run.add_run(columns, start, limit, room)
    # never more than the per-change rules add before they send (its bound on the
    # framing is per change, so it may stop earlier: the rest goes change by change)
    assert 0 <= taken <= _per_change_run(one, changes[start:], limit, room)
    for kg, data in changes[start : start + taken]:
        one.add(kg, data)
    assert (run.count, run.nbytes, run.framing) == (one.count, one.nbytes, one.framing)
    assert run.drain() == one.drain()


def test_columns_leave_anything_but_good_pairs_to_the_per_change_path() -> None:
    buf = ChangeBuffer((0, 5), 10)
    assert buf.columns([(1, b"a"), (5, b"bc")]) == ([1, 5], [b"a", b"bc"], [1, 2])
    for bad in (
        [(1, b"a"), (6, b"b")],  # a key group out of range
        [(1, b"a"), (2, b"x" * 11)],  # a change over the limit
        [(1, b"a"), (2, bytearray(b"b"))],  # not bytes: copied by add
        [(1, b"a"), (2, b"b", 3)],  # not a pair
        [(1, b"a"), [2, b"b"]],  # not a tuple
        [(True, b"a")],  # not an int
    ):
        assert buf.columns(bad) is None


def test_append_many_sends_and_stores_what_appending_each_does(
    sidecar: ServerProcess, transport: str
) -> None:
    # a batch of 2 KiB and a 4 KiB message: many sends, before and after changes
    limit = 4 * KiB
    rng = random.Random(7)
    changes = [(rng.randrange(8), rng.randbytes(rng.randrange(300))) for _ in range(3000)]
    results = []
    for name, many in (("one-by-one", False), ("many", True)):
        before = sidecar.scrape_metrics()
        with ChangelogClient(
            sidecar.address,
            batch_bytes=2 * KiB,
            max_message_bytes=limit + REQUEST_MARGIN_BYTES,
            transport=transport,
        ) as c:
            w = c.create_writer(
                job_id=f"many-{transport}", operator_id=name, key_group_range=(0, 7)
            )
            if many:
                w.append_many(iter(changes))  # read in chunks, across chunk boundaries
            else:
                for kg, data in changes:
                    w.append(kg, data)
            handle = w.persist_durably(after=0).result(timeout=30)
        with ChangelogClient(sidecar.address) as reader:  # read messages may be larger
            got = list(reader.read_changes(handle))
        after = sidecar.scrape_metrics()
        requests = after["dstl_append_requests_total"] - before["dstl_append_requests_total"]
        results.append((requests, got))
    (requests_each, got_each), (requests_many, got_many) = results
    assert requests_each > 50  # the batch and message limits were reached many times
    assert requests_many == requests_each  # the same sends
    assert got_many == got_each  # the same changes under the same SQNs
    assert [(kg, data) for kg, _sqn, data in got_each] == sorted(changes, key=lambda c: c[0])
