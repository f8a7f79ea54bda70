"""call_header: a writer call's log id, session, seq and whether it carries changes, off the
wire without decoding its changes (what the sidecar reads of a call it has no room for)."""

from __future__ import annotations

import pytest

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_server.request_bounds import CallHeader, call_header


def append(log_id: str = "w1", parts: int = 1) -> pb.AppendRequest:
    req = pb.AppendRequest(log_id=log_id, session=5, seq=7)
    for kg in range(parts):
        req.changes.add(key_group=kg, count=1, sizes=b"\x03\x00\x00\x00", payload=b"abc")
    return req


def test_unary_calls() -> None:
    assert call_header("Append", append().SerializeToString()) == CallHeader("w1", True, 5, 7)
    empty = pb.PersistRequest(log_id="w2", after=3, session=9, seq=2)
    assert call_header("PersistDurably", empty.SerializeToString()) == CallHeader("w2", False, 9, 2)
    persist = pb.PersistRequest(log_id="w2", after=3, session=9, seq=2)
    persist.changes.add(key_group=1)
    assert call_header("PersistDurably", persist.SerializeToString()) == CallHeader(
        "w2", True, 9, 2
    )
    assert call_header("Truncate", b"") is None  # never carries changes


def test_session_requests() -> None:
    req = pb.SessionRequest(id=42)
    req.append.CopyFrom(append("w3", parts=3))
    assert call_header("Session", req.SerializeToString()) == CallHeader("w3", True, request_id=42)
    req = pb.SessionRequest(id=43)
    req.persist.log_id = "w3"
    assert call_header("Session", req.SerializeToString()) == CallHeader("w3", False, request_id=43)
    req = pb.SessionRequest(id=44)
    req.truncate.log_id = "w3"
    assert call_header("Session", req.SerializeToString()) == CallHeader("", False, request_id=44)


def test_a_call_split_in_occurrences_is_read_as_protobuf_merges_it() -> None:
    """Two occurrences of the append field merge: changes in either count."""
    first = pb.SessionRequest(id=1)
    first.append.log_id = "w4"
    second = pb.SessionRequest()
    second.append.changes.add(key_group=0)
    data = first.SerializeToString() + second.SerializeToString()
    merged = pb.SessionRequest.FromString(data)
    assert merged.append.log_id == "w4" and len(merged.append.changes) == 1
    assert call_header("Session", data) == CallHeader("w4", True, request_id=1)


@pytest.mark.parametrize("data", [b"\xff", b"\x0a\x05ab", b"\x00\x01", b"\x0a\x02\xff\xfe"])
def test_bytes_that_do_not_scan_give_no_header(data: bytes) -> None:
    assert call_header("Append", data) is None
