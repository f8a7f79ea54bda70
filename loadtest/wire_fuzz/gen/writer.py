"""Requests of the writer RPCs: ``CreateWriter``, ``Append``, ``PersistDurably``,
``LastAppendedSqn``, ``Truncate`` and ``CloseWriter``, for the worker's own
writers (ordered or chaotic), with bad arguments, and naming foreign log ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

from dstl_client.core._pb import dstl_pb2 as pb
from loadtest.wire_fuzz.calls import Call, Writer
from loadtest.wire_fuzz.encoding import Part, c64, describe, describe_parts, encode_parts
from loadtest.wire_fuzz.gen.parts import PartsGen
from loadtest.wire_fuzz.settings import FUZZ_JOBS, U32, KiB


class WriterCalls(PartsGen):
    """Writer RPC requests (one worker thread, like every generator).

    A call of an ordered writer carries the writer's session and next seq
    (``Call.ordered``); the worker advances the seq once it was answered.
    """

    def append(self, w: Writer, only: Sequence[tuple[str, int]] = ()) -> Call:
        session, seq, ordered = self.order_fields(w)
        parts, mode = self.parts(w.kg, only=only)
        head = pb.AppendRequest(log_id=w.log_id, session=session, seq=seq)
        return Call(
            "Append",
            head.SerializeToString() + encode_parts(2, parts),
            f"{describe(head)} + {describe_parts(parts)} [{mode}]",
            w,
            ordered,
            order=(session, seq),
        )

    def persist(self, w: Writer) -> Call:
        session, seq, ordered = self.order_fields(w)
        rng = self.rng
        after = rng.choice(
            (0, 0, w.boundary, w.boundary, c64(w.boundary + 1), max(0, w.boundary - 1), self.u64())
        )
        parts: list[Part] = []
        mode = "none"
        if rng.random() < 0.4:
            parts, mode = self.parts(w.kg, allow_big=rng.random() < 0.3)
        head = pb.PersistRequest(log_id=w.log_id, after=after, session=session, seq=seq)
        return Call(
            "PersistDurably",
            head.SerializeToString() + encode_parts(3, parts),
            f"{describe(head)} + {describe_parts(parts)} [{mode}]",
            w,
            ordered,
            order=(session, seq),
        )

    def last_sqn(self, w: Writer) -> Call:
        session, seq, ordered = self.order_fields(w)
        msg = pb.LastAppendedSqnRequest(log_id=w.log_id, session=session, seq=seq)
        return Call(
            "LastAppendedSqn",
            msg.SerializeToString(),
            describe(msg),
            w,
            ordered,
            order=(session, seq),
        )

    def truncate(self, w: Writer) -> Call:
        session, seq, ordered = self.order_fields(w)
        rng = self.rng
        before = rng.choice(
            (0, w.boundary, max(0, w.boundary - 1), c64(w.boundary + 1), self.u64())
        )
        msg = pb.TruncateRequest(log_id=w.log_id, before=before, session=session, seq=seq)
        return Call(
            "Truncate", msg.SerializeToString(), describe(msg), w, ordered, order=(session, seq)
        )

    def close(self, w: Writer) -> Call:
        msg = pb.CloseWriterRequest(log_id=w.log_id)
        return Call("CloseWriter", msg.SerializeToString(), describe(msg), w)

    def create_pooled(self, hoarder: bool = False) -> Call:
        """CreateWriter of a writer the worker keeps (``Call.pool`` says what it will be)."""
        rng = self.rng
        job = rng.choice(FUZZ_JOBS)
        first = rng.choice((0, 0, 10, 1000, (1 << 24) - 8))
        last = first + rng.choice((0, 7, 7, 127))
        if rng.random() < 0.1:
            first, last = 0, (1 << 24) - 1
        ordered = hoarder or rng.random() < self.ordered_fraction
        msg = pb.CreateWriterRequest(
            job_id=job, operator_id="op", first_key_group=first, last_key_group=last
        )
        return Call(
            "CreateWriter",
            msg.SerializeToString(),
            describe(msg),
            pool=(job, (first, last), ordered, hoarder),
        )

    def create_bad(self) -> Call:
        rng = self.rng
        job = rng.choice(
            (
                rng.choice(FUZZ_JOBS),
                "",
                "../" + FUZZ_JOBS[0],
                "/abs",
                "a" * 129,
                "a" * 128,
                "job\n",
                "j\x00b",
                "\u00e9t\u00e9",
                "x" * (256 * KiB),
            )
        )
        op = rng.choice(("op", "", "o" * 256, "o" * 257, "o" * (256 * KiB)))
        first = self.u32()
        last = rng.choice((first, self.u32(), U32, (1 << 24) - 1, 1 << 24, max(0, first - 1)))
        msg = pb.CreateWriterRequest(
            job_id=job, operator_id=op, first_key_group=first, last_key_group=last
        )
        return Call("CreateWriter", msg.SerializeToString(), describe(msg))

    def foreign(self) -> Call:
        """A writer call naming a log id that no writer of this worker has."""
        rng = self.rng
        log_id = self.foreign_log_id()
        method = rng.choice(
            ("Append", "PersistDurably", "LastAppendedSqn", "Truncate", "CloseWriter")
        )
        session, seq = self.u64(), self.u64()
        msg: Message
        tail = b""
        extra = ""
        if method == "Append":
            parts, mode = self.parts((0, 7), allow_big=False)
            msg = pb.AppendRequest(log_id=log_id, session=session, seq=seq)
            tail, extra = encode_parts(2, parts), f" + {describe_parts(parts)} [{mode}]"
        elif method == "PersistDurably":
            msg = pb.PersistRequest(log_id=log_id, after=self.u64(), session=session, seq=seq)
        elif method == "LastAppendedSqn":
            msg = pb.LastAppendedSqnRequest(log_id=log_id, session=session, seq=seq)
        elif method == "Truncate":
            msg = pb.TruncateRequest(log_id=log_id, before=self.u64(), session=session, seq=seq)
        else:
            msg = pb.CloseWriterRequest(log_id=log_id)
        return Call(method, msg.SerializeToString() + tail, describe(msg) + extra)
