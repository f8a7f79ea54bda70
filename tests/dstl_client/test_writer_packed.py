"""``append_packed``: a packed run of changes is the same as appending each change."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstl_client._buffer import ChangeBuffer
from dstl_client.client import REQUEST_MARGIN_BYTES, ChangelogClient
from dstl_client.core.errors import ChangeTooLarge, InvalidArgument, KeyGroupOutOfRange
from dstl_client.writer import _fit
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
    end, nbytes = _fit(array("I", sizes), start, free)
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
