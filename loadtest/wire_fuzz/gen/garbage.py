"""Request bytes that are not a well-formed request (or only by accident): random,
bit-flipped, truncated, invalid UTF-8, wrong wire types, bad lengths, overlong varints.
"""

from __future__ import annotations

from dstl_client.core._pb import dstl_pb2 as pb
from loadtest.wire_fuzz.calls import Call
from loadtest.wire_fuzz.encoding import tag, varint
from loadtest.wire_fuzz.gen.base import GenBase
from loadtest.wire_fuzz.settings import METHODS


class GarbageCalls(GenBase):
    """Garbage requests (one worker thread, like every generator)."""

    def garbage(self, base: Call | None) -> Call:
        """Bytes that are not a well-formed request (or only by accident)."""
        rng = self.rng
        method = base.method if base is not None and rng.random() < 0.5 else rng.choice(METHODS)
        mode = self.weighted(
            [
                ("random", 30),
                ("big_random", 2),
                ("flipped", 20),
                ("truncated", 15),
                ("bad_utf8", 10),
                ("wrong_wire_type", 10),
                ("bad_length", 8),
                ("overlong_varint", 5),
            ]
        )
        valid = (
            base.request
            if base is not None
            else pb.AppendRequest(log_id=self.hex32()).SerializeToString()
        )
        if mode == "random":
            data = rng.randbytes(rng.randint(1, 4096))
        elif mode == "big_random":
            data = rng.randbytes(int(self.s.max_request_bytes * rng.uniform(0.5, 0.99)))
        elif mode == "flipped":
            buf = bytearray(valid)
            for _ in range(rng.randint(1, 8)):
                if buf:
                    buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
            data = bytes(buf)
        elif mode == "truncated":
            data = valid[: rng.randrange(max(1, len(valid)))]
        elif mode == "bad_utf8":  # a string field (log_id / job_id) holding invalid UTF-8
            bad = rng.choice((b"\xff\xfe\xfd", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b"))
            data = tag(1, 2) + varint(len(bad)) + bad
        elif mode == "wrong_wire_type":
            data = rng.choice(
                (
                    tag(15, 2) + varint(3) + b"abc",  # seq as bytes
                    tag(2, 0) + varint(5),  # changes / after / page_size as varint
                    tag(1, 5) + b"\x00\x00\x00\x00",  # log_id / job_id as fixed32
                    tag(14, 1) + b"\x00" * 8,  # session as fixed64
                    tag(3, 0) + varint(7),  # page_token as varint
                )
            )
        elif mode == "bad_length":  # a length prefix far past the end
            data = (
                tag(rng.choice((1, 2, 3, 99)), 2)
                + varint(rng.choice((1 << 31, 1 << 62, 100)))
                + b"x"
            )
        else:  # an 11-byte varint
            data = tag(15, 0) + b"\xff" * 10 + b"\x01"
        return Call(
            method,
            data,
            f"garbage to {method} [{mode}]: {len(data)} bytes {data[:48].hex()}"
            + ("..." if len(data) > 48 else ""),
            streaming=method == "ReadChanges",
        )
