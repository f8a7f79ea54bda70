"""Wire fuzzer of the ``dstl.v1.Changelog`` service (``make bench-fuzz``).

Sends raw gRPC requests straight onto the wire, bypassing every check of
``dstl_client``: random log ids (own writers, random hex, empty, huge),
numbers up to 2^64-1 (``seq``, ``session``, ``after``, ``before``, SQN
ranges, handle offsets and lengths) and 2^32-1 (key groups, counts), key-group
parts that are empty, inconsistent, zero-count, too large or very many,
requests near and over the message limit, ``ReadChanges`` handles with
random offsets, lengths, SQN and key-group ranges, foreign, traversing and
absolute object keys and bad format versions, ``CreateWriter`` and
``DiscardObjects`` with bad arguments, and plain garbage request bytes.

Invariants (a violation is printed with the request that caused it, the
seed, the worker and call number, and the calls around it):

* ``typed-errors``: every call ends OK or with a typed error: a status other
  than UNKNOWN and INTERNAL that carries the ``dstl-error-kind`` trailer. The
  one exception is a request larger than ``max_request_bytes``, which gRPC
  itself refuses with RESOURCE_EXHAUSTED before the service sees it.
* ``call-bound``: every call is answered within ``CALL_TIMEOUT_S`` (10 s);
  the fuzz server runs with short sequencing, backpressure and upload
  timeouts, so no legitimate wait comes near it.
* ``call-order``: half of the writers are *ordered*: their calls carry the
  writer's session and the next ``seq``, one at a time, exactly as the
  client library sends them, with only their other fields fuzzed. Every such
  call was answered, so the sidecar must never tell such a writer that one of
  its calls was lost (``call_lost``): a refused call must still take its
  turn. (The other writers send random sessions and seqs.)
* ``health``: ``grpc.health.v1.Health/Check`` answers SERVING within 1 s,
  checked by every worker every ``HEALTH_EVERY_CALLS`` calls and by a monitor
  thread every ``MONITOR_INTERVAL_S``.
* ``rss``: the server's RSS (sampled every ``MONITOR_INTERVAL_S``) stays
  below ``start RSS + 4 x max_in_flight_bytes + 64 MiB`` (241 MiB with the
  fuzz settings). The sidecar bounds what it holds by ``max_in_flight_bytes``
  (one request may overcommit it by one request's worth of parts); on top
  come objects being encoded (about the in-flight bytes again), the requests
  being decoded (a few times ``max_request_bytes`` each) and allocator slack.
  Four times the budget plus 64 MiB holds all of that with room; memory the
  budget does not see (parts it does not charge, buffers the allocator never
  returns) crosses it within seconds. Each worker keeps one *hoarding*
  writer that only appends big many-part batches and never persists, so such
  memory piles up instead of being freed by the next persist. When the
  fuzzer started the server itself it kills it once RSS runs 1 GiB past the
  bound, to protect the machine.
* ``bystander``: a writer of another job, written with the real client
  before the fuzzing, reads back byte-exact afterwards and can still append
  and persist.

Requests travel as bytes through ``channel.unary_unary(path,
request_serializer=None)`` (what ``ChangelogStub`` sends, minus the
serializer), so well-formed, crafted and garbage requests take one path.

``python -m loadtest.wire_fuzz --duration-s 300 [--seed N]`` starts its own
server (or fuzzes ``--address``, with ``--server-pid`` for the RSS check),
prints progress every few seconds and ends with a PASS/MISS line per
invariant; the exit status is 1 if any invariant was violated. ``--ops``
narrows the operation mix, ``--ordered-fraction`` the share of ordered
writers. A seed fixes every random choice of every worker; the requests also
depend on the server's answers and timing, so a replay usually but not always
hits the same failure, which is why each violation prints its request.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import struct
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dstl_client import ChangelogClient, ChangelogHandle
from dstl_client.core._pb import dstl_pb2 as pb

KiB = 1 << 10
MiB = 1 << 20
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1

SERVICE = "/dstl.v1.Changelog/"
ERROR_KIND_KEY = "dstl-error-kind"

#: every call must be answered within this (its gRPC deadline)
CALL_TIMEOUT_S = 10.0
#: a health check must answer SERVING within this
HEALTH_TIMEOUT_S = 1.0
#: each worker checks health after this many of its calls
HEALTH_EVERY_CALLS = 25
#: the monitor thread checks health and samples RSS this often
MONITOR_INTERVAL_S = 0.25
#: RSS bound: start RSS + RSS_IN_FLIGHT_FACTOR x max_in_flight_bytes + RSS_SLACK_BYTES
RSS_IN_FLIGHT_FACTOR = 4
RSS_SLACK_BYTES = 64 * MiB
#: past the bound by this much, a server this run started is killed (protects the machine)
RUNAWAY_BYTES = 1024 * MiB
#: the run stops after this many consecutive failed monitor health checks (server stalled)
FATAL_HEALTH_FAILURES = 8
#: writers a worker keeps; a writer is replaced after this many calls
WRITERS_PER_WORKER = 4
WRITER_MAX_CALLS = 150
#: distinct violations kept with their example (the rest are only counted)
MAX_DISTINCT_VIOLATIONS = 60
DESC_LIMIT = 700

FUZZ_JOBS = ("fuzz-a", "fuzz-b")
BYSTANDER_JOB = "bystander"
INVARIANTS = ("typed-errors", "call-bound", "call-order", "health", "rss", "bystander")

_INTERESTING_U64 = (
    0,
    1,
    2,
    (1 << 31) - 1,
    1 << 31,
    U32,
    1 << 32,
    1 << 40,
    1 << 53,
    (1 << 63) - 1,
    1 << 63,
    U64 - 1,
    U64,
)
_INTERESTING_U32 = (0, 1, (1 << 24) - 1, 1 << 24, (1 << 31) - 1, 1 << 31, U32 - 1, U32)
_METHODS = (
    "CreateWriter",
    "Append",
    "LastAppendedSqn",
    "PersistDurably",
    "Truncate",
    "CloseWriter",
    "ReadChanges",
    "DiscardObjects",
)


# ----------------------------------------------------------------- settings
@dataclass(frozen=True, slots=True)
class FuzzSettings:
    """The server settings the fuzzer assumes (and passes to a server it starts)."""

    max_in_flight_bytes: int = 32 * MiB
    max_request_bytes: int = 2 * MiB
    max_change_bytes: int = 512 * KiB
    batch_size_threshold: int = 4 * MiB
    preemptive_persist_threshold: int = 1 * MiB
    call_order_timeout_s: float = 0.5
    backpressure_timeout_s: float = 1.0
    upload_timeout_s: float = 2.0
    upload_deadline_s: float = 5.0
    persist_delay_ms: float = 5.0

    def server_args(self) -> list[str]:
        args: list[str] = []
        for name in self.__slots__:
            args += ["--" + name.replace("_", "-"), str(getattr(self, name))]
        return [*args, "--no-fsync"]

    @property
    def rss_allowance(self) -> int:
        return RSS_IN_FLIGHT_FACTOR * self.max_in_flight_bytes + RSS_SLACK_BYTES


# ----------------------------------------------------------------- describing
def _nice_int(v: int) -> str:
    if v >= 1 << 16:
        for k in range(16, 65):
            if v == 1 << k:
                return f"{v} (2^{k})"
            if v == (1 << k) - 1:
                return f"{v} (2^{k}-1)"
    return str(v)


def _short(v: Any) -> str:
    if isinstance(v, Message):
        return describe(v)
    if isinstance(v, str | bytes):
        return f"{v[:40]!r}..(len {len(v)})" if len(v) > 48 else repr(v)
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return _nice_int(v)
    return repr(v)


def describe(msg: Message) -> str:
    """One line naming every set field; long strings, bytes and lists shortened."""
    parts: list[str] = []
    for fd, value in msg.ListFields():
        if fd.is_repeated:
            items = list(value)
            shown = ", ".join(_short(x) for x in items[:3])
            more = ", ..." if len(items) > 3 else ""
            parts.append(f"{fd.name}=[{shown}{more}] (n={len(items)})")
        else:
            parts.append(f"{fd.name}={_short(value)}")
    return f"{type(msg).__name__}({', '.join(parts)})"


def _clip(text: str, limit: int = DESC_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f"...(+{len(text) - limit + 20})"


# ----------------------------------------------------------------- raw encoding
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field_no: int, wire_type: int) -> bytes:
    return _varint(field_no << 3 | wire_type)


def _c64(v: int) -> int:
    """Clamp to what a uint64 field holds."""
    return min(v, U64)


def _sizes(*lengths: int) -> bytes:
    return struct.pack(f"<{len(lengths)}I", *lengths)


@dataclass(frozen=True, slots=True)
class Part:
    """One ``KeyGroupChanges`` message, sent ``times`` times in a row."""

    msg: pb.KeyGroupChanges
    times: int = 1


def encode_parts(field_no: int, parts: Sequence[Part]) -> bytes:
    out: list[bytes] = []
    for p in parts:
        e = p.msg.SerializeToString()
        out.append((_tag(field_no, 2) + _varint(len(e)) + e) * p.times)
    return b"".join(out)


def describe_parts(parts: Sequence[Part]) -> str:
    shown = ", ".join((f"{p.times} x " if p.times > 1 else "") + describe(p.msg) for p in parts[:4])
    more = ", ..." if len(parts) > 4 else ""
    return f"changes=[{shown}{more}] (n={sum(p.times for p in parts)})"


# ----------------------------------------------------------------- calls
@dataclass(slots=True)
class Writer:
    """What the fuzzer knows of one of its writers."""

    log_id: str
    job_id: str
    kg: tuple[int, int]
    ordered: bool
    session: int
    next_seq: int = 1
    #: an ordered writer whose every call so far reached the sidecar and was answered
    clean: bool = True
    boundary: int = 0
    #: the sidecar refuses its calls (failed, lost, closed): the worker closes and replaces it
    dead: bool = False
    #: a CloseWriter was sent (or the sidecar no longer knows it)
    closed: bool = False
    calls: int = 0
    history: deque[str] = field(default_factory=lambda: deque(maxlen=6))


@dataclass(slots=True)
class Call:
    method: str
    request: bytes
    desc: str
    writer: Writer | None = None
    #: the call takes the next turn of an ordered writer
    ordered: bool = False
    streaming: bool = False
    #: CreateWriter of a writer the worker keeps: (job, kg range, ordered, hoarder)
    pool: tuple[str, tuple[int, int], bool, bool] | None = None
    #: (session, seq) of a writer call
    order: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    code: str  # "OK" or the gRPC status name
    kind: str | None
    details: str
    elapsed_s: float
    response: bytes | None = None
    responses: int = 0

    def summary(self) -> str:
        if self.code == "OK":
            return f"OK in {self.elapsed_s:.2f}s"
        kind = f"kind={self.kind}" if self.kind else "no dstl-error-kind"
        return f"{self.code} ({kind}) in {self.elapsed_s:.2f}s: {self.details[:300]}"


def invoke(channel: Any, call: Call, timeout_s: float = CALL_TIMEOUT_S) -> Outcome:
    """Send the call's bytes as they are; never raises for an RPC failure."""
    t0 = time.monotonic()
    path = SERVICE + call.method
    try:
        if call.streaming:
            stream = channel.unary_stream(
                path, request_serializer=None, response_deserializer=None
            )(call.request, timeout=timeout_s)
            n = 0
            for _ in stream:
                n += 1
            return Outcome("OK", None, "", time.monotonic() - t0, None, n)
        resp = channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
            call.request, timeout=timeout_s
        )
        return Outcome("OK", None, "", time.monotonic() - t0, bytes(resp), 1)
    except grpc.RpcError as exc:
        elapsed = time.monotonic() - t0
        kind = None
        try:
            for key, value in exc.trailing_metadata() or ():
                if key == ERROR_KIND_KEY:
                    kind = str(value)
        except Exception:
            pass
        try:
            code = str(exc.code().name)
            details = str(exc.details() or "")
        except Exception:
            code, details = "UNKNOWN", repr(exc)
        return Outcome(code, kind, details, elapsed)


def check_health(channel: Any) -> tuple[bool, str]:
    """(SERVING within HEALTH_TIMEOUT_S, what happened)."""
    stub = health_pb2_grpc.HealthStub(channel)
    t0 = time.monotonic()
    try:
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_TIMEOUT_S)
    except grpc.RpcError as exc:
        return False, f"health check failed after {time.monotonic() - t0:.2f}s: {exc.code().name}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return resp.status == health_pb2.HealthCheckResponse.SERVING, f"health {status}"


# ----------------------------------------------------------------- generators
class Gen:
    """Random requests; every choice comes from ``rng`` (one per worker)."""

    def __init__(
        self, rng: random.Random, settings: FuzzSettings, ordered_fraction: float = 0.5
    ) -> None:
        self.rng = rng
        self.s = settings
        self.ordered_fraction = ordered_fraction

    # ---------------------------------------------------------- numbers
    def u64(self) -> int:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(_INTERESTING_U64)
        if r < 0.8:
            return self.rng.randrange(0, 1000)
        return self.rng.getrandbits(64)

    def u32(self) -> int:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(_INTERESTING_U32)
        if r < 0.8:
            return self.rng.randrange(0, 1000)
        return self.rng.getrandbits(32)

    def weighted(self, options: Sequence[tuple[str, int]]) -> str:
        return self.rng.choices([o for o, _ in options], [w for _, w in options])[0]

    def hex32(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    def foreign_log_id(self) -> str:
        return self.rng.choice(
            (
                lambda: self.hex32(),
                lambda: "",
                lambda: self.hex32().upper(),
                lambda: self.hex32()[:31],
                lambda: self.hex32() + "0",
                lambda: "zz" * 16,
                lambda: "\u00e9" * 32,
                lambda: "\x00" * 32,
                lambda: "../" * 20,
                lambda: "a" * self.rng.choice((1000, 64 * KiB, 1 * MiB)),
            )
        )()

    def object_key(self, job: str) -> str:
        h = self.hex32()
        return f"{job}/{h[:2]}/{h}.dstl"

    # ---------------------------------------------------------- changes
    def _valid_part(
        self, kg: int, max_changes: int = 16, max_size: int = 256
    ) -> pb.KeyGroupChanges:
        n = self.rng.randint(1, max_changes)
        lens = [self.rng.randint(0, max_size) for _ in range(n)]
        return pb.KeyGroupChanges(
            key_group=kg, count=n, sizes=_sizes(*lens), payload=self.rng.randbytes(sum(lens))
        )

    def _kg_in(self, kg: tuple[int, int]) -> int:
        first, last = kg
        return self.rng.choice((first, last, self.rng.randint(first, last)))

    def _kg_out(self, kg: tuple[int, int]) -> int:
        first, last = kg
        options = [last + 1, U32, 1 << 24, 1 << 31, self.rng.getrandbits(32)]
        if first > 0:
            options.append(first - 1)
        return self.rng.choice([o for o in options if o <= U32 and not first <= o <= last])

    def _inconsistent(self, kg: int) -> pb.KeyGroupChanges:
        mode = self.rng.randrange(9)
        if mode == 0:  # count far above what sizes holds
            return pb.KeyGroupChanges(key_group=kg, count=U32, sizes=_sizes(1), payload=b"x")
        if mode == 1:  # sizes not a multiple of 4
            return pb.KeyGroupChanges(key_group=kg, count=1, sizes=b"\x01\x00\x00", payload=b"x")
        if mode == 2:  # sizes add up to more than the payload
            return pb.KeyGroupChanges(key_group=kg, count=2, sizes=_sizes(5, 5), payload=b"x" * 9)
        if mode == 3:  # payload longer than the sizes say
            return pb.KeyGroupChanges(key_group=kg, count=1, sizes=_sizes(1), payload=b"xy")
        if mode == 4:  # payload without changes
            return pb.KeyGroupChanges(key_group=kg, count=0, sizes=b"", payload=b"orphan")
        if mode == 5:  # huge sizes
            return pb.KeyGroupChanges(
                key_group=kg, count=2, sizes=_sizes(U32, U32), payload=b"x" * 16
            )
        if mode == 6:  # a count of 2^30 without sizes
            return pb.KeyGroupChanges(key_group=kg, count=1 << 30, sizes=b"", payload=b"")
        if mode == 7:  # sizes for 3 changes, count says 2
            return pb.KeyGroupChanges(key_group=kg, count=2, sizes=_sizes(1, 1, 1), payload=b"xyz")
        return pb.KeyGroupChanges(  # random everything
            key_group=kg,
            count=self.u32(),
            sizes=self.rng.randbytes(self.rng.randrange(0, 64)),
            payload=self.rng.randbytes(self.rng.randrange(0, 64)),
        )

    def _fill(self, msgs: Sequence[pb.KeyGroupChanges], target: int) -> list[Part]:
        """Each of ``msgs`` repeated, together about ``target`` encoded bytes."""
        per_round = sum(len(m.SerializeToString()) + 4 for m in msgs)
        times = max(1, target // max(per_round, 1))
        return [Part(m, times) for m in msgs]

    def parts(
        self,
        kg: tuple[int, int],
        *,
        allow_big: bool = True,
        only: Sequence[tuple[str, int]] = (),
    ) -> tuple[list[Part], str]:
        """Key-group parts for an Append or a Persist, and the name of the mode."""
        s = self.s
        modes: list[tuple[str, int]] = [
            ("valid", 34),
            ("empty", 4),
            ("zero_count", 6),
            ("inconsistent", 14),
            ("bad_kg", 8),
            ("mixed", 6),
            ("change_limit", 4),
        ]
        if allow_big:
            modes += [
                ("near_limit", 4),
                ("over_limit", 1),
                ("many_empty", 4),
                ("many_small", 4),
                ("many_count", 2),
                ("many_groups", 3),
            ]
        mode = self.weighted(only or modes)
        rng = self.rng
        if mode == "valid":
            return [Part(self._valid_part(self._kg_in(kg))) for _ in range(rng.randint(1, 4))], mode
        if mode == "empty":
            return [], mode
        if mode == "zero_count":
            n = rng.choice((1, 2, 10, 1000))
            return [Part(pb.KeyGroupChanges(key_group=self._kg_in(kg), count=0), n)], mode
        if mode == "inconsistent":
            return [Part(self._inconsistent(self._kg_in(kg)))], mode
        if mode == "bad_kg":
            return [Part(self._valid_part(self._kg_out(kg), 2, 8))], mode
        if mode == "mixed":  # good parts around a bad one: all or nothing
            bad = rng.choice(
                (
                    self._inconsistent(self._kg_in(kg)),
                    self._valid_part(self._kg_out(kg), 1, 4),
                    pb.KeyGroupChanges(key_group=self._kg_in(kg), count=0),
                )
            )
            return [
                Part(self._valid_part(self._kg_in(kg))),
                Part(bad),
                Part(self._valid_part(self._kg_in(kg))),
            ], mode
        if mode == "change_limit":
            size = s.max_change_bytes + rng.choice((0, 0, 1, 1000))
            return [
                Part(
                    pb.KeyGroupChanges(
                        key_group=self._kg_in(kg),
                        count=2,
                        sizes=_sizes(1, size),
                        payload=b"y" + b"\xcd" * size,
                    )
                )
            ], mode
        if mode in ("near_limit", "over_limit"):
            if mode == "near_limit":
                target = s.max_request_bytes - rng.randint(8 * KiB, 64 * KiB)
            else:
                target = s.max_request_bytes + rng.randint(1, 64 * KiB)
            out: list[Part] = []
            left = target
            while left > 64:
                size = min(
                    left - 32, s.max_change_bytes, rng.choice((s.max_change_bytes, 64 * KiB))
                )
                payload = rng.randbytes(min(size, 4096)) * (size // 4096) + rng.randbytes(
                    size % 4096
                )
                out.append(
                    Part(
                        pb.KeyGroupChanges(
                            key_group=self._kg_in(kg), count=1, sizes=_sizes(size), payload=payload
                        )
                    )
                )
                left -= size + 32
            return out, mode
        target = int(s.max_request_bytes * rng.uniform(0.3, 0.95))
        kgs = [self._kg_in(kg) for _ in range(rng.randint(1, 4))]
        if mode == "many_empty":
            return self._fill([pb.KeyGroupChanges(key_group=k) for k in kgs], target), mode
        if mode == "many_small":
            msgs = [
                pb.KeyGroupChanges(key_group=k, count=1, sizes=_sizes(len(p)), payload=p)
                for k, p in zip(kgs, (b"", b"x", b"", b"yz"), strict=False)
            ]
            return self._fill(msgs, target), mode
        if mode == "many_count":  # one part of very many zero-length changes (valid)
            n = target // 4
            return [Part(pb.KeyGroupChanges(key_group=kgs[0], count=n, sizes=bytes(4 * n)))], mode
        # many_groups: many small valid parts, every key group different where possible
        first, last = kg
        n = rng.choice((100, 1000, 10_000))
        return [
            Part(
                pb.KeyGroupChanges(
                    key_group=first + i % (last - first + 1), count=1, sizes=_sizes(1), payload=b"g"
                )
            )
            for i in range(n)
        ], mode

    # ---------------------------------------------------------- requests
    def order_fields(self, w: Writer) -> tuple[int, int, bool]:
        """(session, seq, ordered) for a call of writer ``w``."""
        if w.ordered:
            return w.session, w.next_seq, True
        rng = self.rng
        session = self.weighted(
            [("same", 70), ("new", 10), ("zero", 5), ("max", 5), ("random", 10)]
        )
        ses = {
            "same": w.session,
            "new": rng.getrandbits(64) or 1,
            "zero": 0,
            "max": U64,
            "random": self.u64(),
        }[session]
        seq_mode = self.weighted(
            [
                ("next", 50),
                ("zero", 10),
                ("skip", 8),
                ("far", 6),
                ("huge", 10),
                ("dup", 6),
                ("random", 10),
            ]
        )
        seq = {
            "next": w.next_seq,
            "zero": 0,
            "skip": _c64(w.next_seq + rng.randint(1, 5)),
            "far": _c64(w.next_seq + rng.choice((1023, 1024, 1025, 5000, 1 << 20))),
            "huge": rng.choice(((1 << 32), (1 << 63) - 1, 1 << 63, U64 - 1, U64)),
            "dup": max(1, w.next_seq - 1),
            "random": self.u64(),
        }[seq_mode]
        return ses, seq, False

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
            (0, 0, w.boundary, w.boundary, _c64(w.boundary + 1), max(0, w.boundary - 1), self.u64())
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
            (0, w.boundary, max(0, w.boundary - 1), _c64(w.boundary + 1), self.u64())
        )
        msg = pb.TruncateRequest(log_id=w.log_id, before=before, session=session, seq=seq)
        return Call(
            "Truncate", msg.SerializeToString(), describe(msg), w, ordered, order=(session, seq)
        )

    def close(self, w: Writer) -> Call:
        msg = pb.CloseWriterRequest(log_id=w.log_id)
        return Call("CloseWriter", msg.SerializeToString(), describe(msg), w)

    def create_pooled(self, hoarder: bool = False) -> Call:
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

    def synthetic_handle(self) -> tuple[str, pb.Handle]:
        job = self.rng.choice(FUZZ_JOBS)
        h = pb.Handle(
            format_version=1,
            job_id=job,
            log_id=self.hex32(),
            first_key_group=0,
            last_key_group=7,
            from_sqn=0,
            to_sqn=1,
            entries=[
                pb.HandleEntry(
                    object_key=self.object_key(job), offset=0, length=100, first_sqn=0, end_sqn=1
                )
            ],
        )
        return job, h

    def read(self, handles: Sequence[tuple[str, pb.Handle]]) -> Call:
        rng = self.rng
        if handles and rng.random() < 0.85:
            job, base = rng.choice(handles)
            h = pb.Handle()
            h.CopyFrom(base)
        else:
            job, h = self.synthetic_handle()
        other_keys = [e.object_key for j, hh in handles if j != job for e in hh.entries]
        req = pb.ReadChangesRequest()
        labels: list[str] = []
        n_mut = 0 if rng.random() < 0.15 else rng.randint(1, 3)
        for _ in range(n_mut):
            m = self.weighted(
                [
                    ("format_version", 6),
                    ("job_id", 6),
                    ("log_id", 5),
                    ("kg_range", 6),
                    ("sqn_range", 6),
                    ("offset", 12),
                    ("length", 12),
                    ("entry_sqn", 6),
                    ("object_key", 12),
                    ("many_entries", 3),
                    ("no_entries", 2),
                    ("key_groups", 10),
                ]
            )
            labels.append(m)
            entry = h.entries[rng.randrange(len(h.entries))] if h.entries else None
            if m == "format_version":
                h.format_version = rng.choice((0, 2, 255, U32))
            elif m == "job_id":
                h.job_id = rng.choice(
                    (
                        FUZZ_JOBS[0] if job != FUZZ_JOBS[0] else FUZZ_JOBS[1],
                        BYSTANDER_JOB,
                        "",
                        "../" + job,
                        "a" * 129,
                        job + "/../" + BYSTANDER_JOB,
                        "\u00e9t\u00e9",
                        "j" * (64 * KiB),
                    )
                )
            elif m == "log_id":
                h.log_id = self.foreign_log_id()
            elif m == "kg_range":
                h.first_key_group, h.last_key_group = rng.choice(
                    (
                        (5, 4),
                        (0, U32),
                        (U32, U32),
                        (0, 1 << 24),
                        (1 << 31, 1 << 31),
                        (self.u32(), self.u32()),
                    )
                )
            elif m == "sqn_range":
                h.from_sqn, h.to_sqn = rng.choice(
                    (
                        (U64, 0),
                        (0, U64),
                        (U64 - 1, U64),
                        (1 << 63, (1 << 63) + 1),
                        (5, 5),
                        (self.u64(), self.u64()),
                    )
                )
            elif m == "offset" and entry is not None:
                entry.offset = rng.choice(
                    (
                        1 << 63,
                        U64,
                        1 << 40,
                        (1 << 63) - 1,
                        1 << 32,
                        _c64(entry.offset + 1),
                        max(0, entry.offset - 1),
                        self.u64(),
                    )
                )
            elif m == "length" and entry is not None:
                entry.length = rng.choice(
                    (
                        0,
                        1,
                        7,
                        1 << 63,
                        U64,
                        1 << 40,
                        1 << 31,
                        1 << 33,
                        _c64(entry.length + 1),
                        _c64(entry.length * 2),
                        self.u64(),
                    )
                )
            elif m == "entry_sqn" and entry is not None:
                entry.first_sqn, entry.end_sqn = rng.choice(
                    (
                        (0, U64),
                        (U64 - 1, U64),
                        (5, 5),
                        (10, 3),
                        (1 << 63, (1 << 63) + 1),
                        (self.u64(), self.u64()),
                    )
                )
            elif m == "object_key" and entry is not None:
                hx = self.hex32()
                choices = [
                    f"{job}/../{BYSTANDER_JOB}/{hx[:2]}/{hx}.dstl",
                    "/etc/passwd",
                    "../../../../etc/passwd",
                    f"{job}/{hx[:2]}/../../../etc/passwd",
                    self.object_key(job),  # well formed, no such object
                    "",
                    "k" * 2000,
                    "k" * (64 * KiB),
                    f"{job}/{hx[:2].upper()}/{hx.upper()}.dstl",
                    f"/{job}/{hx[:2]}/{hx}.dstl",
                    f"{job}/{hx[:2]}/{hx}.dstl/..",
                    self.object_key(BYSTANDER_JOB),
                ]
                if other_keys:
                    choices.append(rng.choice(other_keys))
                entry.object_key = rng.choice(choices)
            elif m == "many_entries" and entry is not None:
                n = rng.choice((100, 1000, 5000))
                copies = []
                for i in range(n):
                    e = pb.HandleEntry()
                    e.CopyFrom(entry)
                    e.first_sqn, e.end_sqn = 2 * i, 2 * i + 1
                    copies.append(e)
                del h.entries[:]
                h.entries.extend(copies)
                h.from_sqn, h.to_sqn = 0, 2 * n
            elif m == "no_entries":
                del h.entries[:]
            elif m == "key_groups":
                first, last = h.first_key_group, h.last_key_group
                req.key_groups.extend(
                    rng.choice(
                        (
                            [first],
                            [min(U32, last + 1)],
                            [U32],
                            list(range(10_000)),
                            [first] * 1000,
                            [rng.getrandbits(32) for _ in range(100)],
                        )
                    )
                )
        req.handle.CopyFrom(h)
        return Call(
            "ReadChanges",
            req.SerializeToString(),
            f"{describe(req)} [{'+'.join(labels) or 'unchanged'}]",
            streaming=True,
        )

    def discard(self, handles: Sequence[tuple[str, pb.Handle]]) -> Call:
        rng = self.rng
        job = rng.choice(
            (
                *FUZZ_JOBS,
                FUZZ_JOBS[0],
                "",
                "../" + FUZZ_JOBS[0],
                "a" * 129,
                "/abs",
                "d" * (64 * KiB),
            )
        )
        own = [e.object_key for j, h in handles if j == job for e in h.entries]
        other = [e.object_key for j, h in handles if j != job for e in h.entries]
        mode = rng.choice(
            ("own", "other", "traversal", "absolute", "too_many", "none", "empty_key")
        )
        hx = self.hex32()
        kp = job if 0 < len(job) <= 128 else "x"  # huge job ids: short key prefixes
        keys: list[str]
        if mode == "own":
            keys = rng.sample(own, min(len(own), 3)) if own else [self.object_key(kp)]
        elif mode == "other":
            keys = rng.sample(other, min(len(other), 3)) if other else [self.object_key("fuzz-b")]
        elif mode == "traversal":
            keys = [f"{kp}/../{BYSTANDER_JOB}/{hx[:2]}/{hx}.dstl", "../" * 8 + "etc/passwd"]
        elif mode == "absolute":
            keys = ["/etc/passwd", f"/{kp}/{hx[:2]}/{hx}.dstl"]
        elif mode == "too_many":
            keys = [self.object_key(kp)] * 10_001
        elif mode == "none":
            keys = []
        else:
            keys = [""]
        msg = pb.DiscardObjectsRequest(job_id=job, object_keys=keys)
        return Call("DiscardObjects", msg.SerializeToString(), f"{describe(msg)} [{mode}]")

    def garbage(self, base: Call | None) -> Call:
        """Bytes that are not a well-formed request (or only by accident)."""
        rng = self.rng
        method = base.method if base is not None and rng.random() < 0.5 else rng.choice(_METHODS)
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
            data = _tag(1, 2) + _varint(len(bad)) + bad
        elif mode == "wrong_wire_type":
            data = rng.choice(
                (
                    _tag(15, 2) + _varint(3) + b"abc",  # seq as bytes
                    _tag(2, 0) + _varint(5),  # changes / after as varint
                    _tag(1, 5) + b"\x00\x00\x00\x00",  # log_id as fixed32
                    _tag(14, 1) + b"\x00" * 8,  # session as fixed64
                )
            )
        elif mode == "bad_length":  # a length prefix far past the end
            data = (
                _tag(rng.choice((1, 2, 3, 99)), 2)
                + _varint(rng.choice((1 << 31, 1 << 62, 100)))
                + b"x"
            )
        else:  # an 11-byte varint
            data = _tag(15, 0) + b"\xff" * 10 + b"\x01"
        return Call(
            method,
            data,
            f"garbage to {method} [{mode}]: {len(data)} bytes {data[:48].hex()}"
            + ("..." if len(data) > 48 else ""),
            streaming=method == "ReadChanges",
        )


# ----------------------------------------------------------------- the run
@dataclass(slots=True)
class Violation:
    invariant: str
    what: str
    request: str
    seed: int
    worker: int
    call_no: int
    at_s: float
    context: list[str] = field(default_factory=list)
    count: int = 1

    def render(self) -> str:
        lines = [
            f"  [{self.invariant}] x{self.count} {self.what}",
            f"      request: {_clip(self.request)}",
            f"      first at {self.at_s:.1f}s, worker {self.worker}, call {self.call_no}, "
            f"seed {self.seed} (rerun: python -m loadtest.wire_fuzz --seed {self.seed})",
        ]
        lines += [f"      {_clip(c, 400)}" for c in self.context]
        return "\n".join(lines)


def _signature(invariant: str, method: str, what: str) -> str:
    norm = re.sub(r"[0-9a-f]{8,}|\d+", "#", what)
    return f"{invariant}|{method}|{norm[:90]}"


@dataclass
class FuzzReport:
    seed: int
    settings: FuzzSettings
    duration_s: float = 0.0
    calls: int = 0
    by_method: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    seconds_by_method: dict[str, float] = field(default_factory=dict)
    violations: dict[str, Violation] = field(default_factory=dict)
    violation_counts: Counter[str] = field(default_factory=Counter)
    dropped_violations: int = 0
    health_checks: int = 0
    #: answer times of the monitor's successful health checks (seen by the fuzzer)
    health_latencies: list[float] = field(default_factory=list)
    rss_start: int = 0
    rss_peak: int = 0
    rss_bound: int = 0
    rss_checked: bool = False
    bystander_ok: bool | None = None
    bystander_detail: str = ""
    stopped_early: str = ""
    fuzzer_errors: list[str] = field(default_factory=list)

    def invariant_results(self) -> list[tuple[str, bool | None, str]]:
        """(invariant, passed (None: not checked), detail) for each invariant."""
        out: list[tuple[str, bool | None, str]] = []
        for name in INVARIANTS:
            n = self.violation_counts[name]
            distinct = sum(1 for v in self.violations.values() if v.invariant == name)
            if name == "rss" and not self.rss_checked:
                out.append((name, None, "server pid unknown: not checked"))
                continue
            if name == "bystander" and self.bystander_ok is None:
                out.append((name, None, self.bystander_detail or "not run"))
                continue
            if name == "bystander":
                out.append((name, bool(self.bystander_ok), self.bystander_detail))
                continue
            detail = {
                "typed-errors": f"{self.calls} calls, OK or typed error",
                "call-bound": f"every call answered within {CALL_TIMEOUT_S:g}s",
                "call-order": "no ordered writer told a call of it was lost",
                "health": f"{self.health_checks} checks, SERVING within {HEALTH_TIMEOUT_S:g}s "
                f"(answers seen: {self._health_figures()})",
                "rss": f"start {self.rss_start / MiB:.0f} MiB, peak {self.rss_peak / MiB:.0f} MiB, "
                f"bound {self.rss_bound / MiB:.0f} MiB",
            }[name]
            if n:
                detail = f"{n} violations ({distinct} distinct); " + detail
            out.append((name, n == 0, detail))
        return out

    def _health_figures(self) -> str:
        lat = sorted(self.health_latencies)
        if not lat:
            return "none"
        p50 = lat[len(lat) // 2]
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms"

    @property
    def passed(self) -> bool:
        return (
            not self.fuzzer_errors
            and not self.stopped_early
            and all(ok is not False for _, ok, _ in self.invariant_results())
        )

    def render(self) -> str:
        lines = [
            f"wire fuzz: seed {self.seed}, {self.calls} calls in {self.duration_s:.1f}s "
            f"({self.calls / max(self.duration_s, 1e-9):.0f}/s)",
            "  calls by method: "
            + ", ".join(
                f"{k}={v} ({self.seconds_by_method.get(k, 0.0):.1f}s)"
                for k, v in self.by_method.most_common()
            ),
            "  outcomes by kind: " + ", ".join(f"{k}={v}" for k, v in self.by_kind.most_common()),
        ]
        if self.stopped_early:
            lines.append(f"  STOPPED EARLY: {self.stopped_early}")
        for err in self.fuzzer_errors:
            lines.append(f"  FUZZER ERROR: {err}")
        if self.violations:
            lines.append(
                f"Violations ({sum(self.violation_counts.values())} in all, "
                f"{len(self.violations)} distinct shown"
                + (
                    f", {self.dropped_violations} more distinct not kept"
                    if self.dropped_violations
                    else ""
                )
                + "):"
            )
            for v in sorted(self.violations.values(), key=lambda v: (v.invariant, v.at_s)):
                lines.append(v.render())
        lines.append("Invariants:")
        for name, ok, detail in self.invariant_results():
            mark = "SKIP" if ok is None else ("PASS" if ok else "MISS")
            lines.append(f"  {mark}  {name}: {detail}")
        return "\n".join(lines)


class _Run:
    """State shared by the workers and the monitor of one fuzz run."""

    def __init__(
        self,
        address: str,
        settings: FuzzSettings,
        seed: int,
        deadline: float,
        max_calls: int,
        server_pid: int | None,
        on_runaway: Callable[[], None] | None,
        ops: Sequence[tuple[str, int]] = (),
        ordered_fraction: float = 0.5,
    ) -> None:
        self.ops = list(ops or OPS)
        self.ordered_fraction = ordered_fraction
        self.address = address
        self.settings = settings
        self.seed = seed
        self.started = time.monotonic()
        self.deadline = deadline
        self.max_calls = max_calls
        self.server_pid = server_pid
        self.on_runaway = on_runaway
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.report = FuzzReport(seed, settings)
        self.handles: list[tuple[str, pb.Handle]] = []
        self.in_flight: dict[int, tuple[str, float]] = {}
        self.recent: dict[int, deque[str]] = {}
        self.health_failures_in_row = 0

    def channel(self) -> Any:
        return grpc.insecure_channel(
            self.address,
            options=[
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1),
                ("grpc.enable_retries", 0),
            ],
        )

    def server_alive(self) -> bool:
        """False once the server process (when its pid is known) has exited."""
        if not self.server_pid:
            return True
        try:
            return bool(psutil.Process(self.server_pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def take_call_number(self) -> int | None:
        with self.lock:
            if self.report.calls >= self.max_calls:
                return None
            self.report.calls += 1
            return self.report.calls

    def context(self) -> list[str]:
        """What every worker is sending right now and sent just before."""
        now = time.monotonic()
        out: list[str] = []
        with self.lock:
            flying = sorted(self.in_flight.items(), key=lambda item: item[1][1])
            for i, (w, (desc, t0)) in enumerate(flying):
                label = "in flight (longest)" if i == 0 else "in flight"
                out.append(f"{label} on worker {w} for {now - t0:.1f}s: {desc}")
            for w, recent in sorted(self.recent.items()):
                out += [f"worker {w} sent before: {d}" for d in list(recent)[-2:]]
        return out

    def violate(
        self,
        invariant: str,
        what: str,
        request: str,
        worker: int = -1,
        call_no: int = 0,
        context: list[str] | None = None,
        method: str = "",
    ) -> None:
        sig = _signature(invariant, method, what)
        with self.lock:
            r = self.report
            r.violation_counts[invariant] += 1
            v = r.violations.get(sig)
            if v is not None:
                v.count += 1
                return
            if len(r.violations) >= MAX_DISTINCT_VIOLATIONS:
                r.dropped_violations += 1
                return
            r.violations[sig] = Violation(
                invariant,
                what,
                request,
                self.seed,
                worker,
                call_no,
                self.elapsed(),
                context or [],
            )

    def fatal(self, why: str) -> None:
        with self.lock:
            if not self.report.stopped_early:
                self.report.stopped_early = why
        self.stop.set()

    def add_handle(self, job: str, handle: pb.Handle, rng: random.Random) -> None:
        with self.lock:
            if len(self.handles) < 64:
                self.handles.append((job, handle))
            else:
                self.handles[rng.randrange(64)] = (job, handle)

    def snapshot_handles(self) -> list[tuple[str, pb.Handle]]:
        with self.lock:
            return list(self.handles)


_DEAD_KINDS = frozenset({"writer_failed", "call_lost", "writer_closed", "log_not_found"})
#: what a worker does, with weights (``--ops`` picks a subset)
OPS: tuple[tuple[str, int], ...] = (
    ("append", 28),
    ("persist", 12),
    ("last_sqn", 4),
    ("truncate", 6),
    ("close", 2),
    ("create_bad", 4),
    ("read", 20),
    ("discard", 3),
    ("foreign", 6),
    ("garbage", 12),
    ("hoard", 4),
)
#: what the hoarding writer appends: memory the budget must see
HOARD_MODES: tuple[tuple[str, int], ...] = (
    ("many_empty", 3),
    ("many_small", 3),
    ("zero_count", 1),
    ("near_limit", 2),
    ("many_groups", 1),
)


class _Worker(threading.Thread):
    def __init__(self, run: _Run, index: int) -> None:
        super().__init__(name=f"wire-fuzz-{index}", daemon=True)
        self.run_ = run
        self.index = index
        self.rng = random.Random(run.seed * 1000 + index)
        self.gen = Gen(self.rng, run.settings, run.ordered_fraction)
        self.writers: list[Writer] = []
        #: an ordered writer that only ever appends big many-part batches, never persists
        self.hoarder: Writer | None = None
        self.calls = 0

    def run(self) -> None:
        run = self.run_
        with run.lock:
            run.recent[self.index] = deque(maxlen=4)
        channel = run.channel()
        try:
            while not run.stop.is_set() and time.monotonic() < run.deadline:
                if not self._step(channel):
                    break
        except Exception as exc:  # a bug of the fuzzer itself: report it, never hide it
            import traceback

            with run.lock:
                run.report.fuzzer_errors.append(
                    f"worker {self.index}: {exc!r}\n{traceback.format_exc()[-1500:]}"
                )
        finally:
            if not run.report.stopped_early:  # leave nothing behind on a shared server
                for w in [*self.writers, *([self.hoarder] if self.hoarder else [])]:
                    if not w.closed:
                        invoke(channel, self.gen.close(w), timeout_s=2.0)
            channel.close()

    def _retire(self, channel: Any, w: Writer) -> bool:
        """Close a writer the worker gives up (so the fuzzer leaks no writers)."""
        w.dead = True
        if w.closed:
            return True
        w.closed = True
        return self._send(channel, self.gen.close(w))

    def _writer(self, channel: Any) -> Writer | None:
        for w in list(self.writers):
            if (w.dead or w.calls >= WRITER_MAX_CALLS) and not self._retire(channel, w):
                return None
        self.writers = [w for w in self.writers if not w.dead]
        for _ in range(2 * WRITERS_PER_WORKER):
            if len(self.writers) >= WRITERS_PER_WORKER:
                break
            if not self._send(channel, self.gen.create_pooled()):
                return None
        return self.rng.choice(self.writers) if self.writers else None

    def _step(self, channel: Any) -> bool:
        op = self.gen.weighted(self.run_.ops)
        handles = self.run_.snapshot_handles
        call: Call
        if op in ("append", "persist", "last_sqn", "truncate", "close"):
            w = self._writer(channel)
            if w is None:
                return not self.run_.stop.is_set()
            call = {
                "append": self.gen.append,
                "persist": self.gen.persist,
                "last_sqn": self.gen.last_sqn,
                "truncate": self.gen.truncate,
                "close": self.gen.close,
            }[op](w)
        elif op == "hoard":
            if self.hoarder is not None and self.hoarder.dead:
                if not self._retire(channel, self.hoarder):
                    return False
                self.hoarder = None
            if self.hoarder is None:
                call = self.gen.create_pooled(hoarder=True)
            else:
                call = self.gen.append(self.hoarder, HOARD_MODES)
        elif op == "create_bad":
            call = self.gen.create_bad()
        elif op == "read":
            call = self.gen.read(handles())
        elif op == "discard":
            call = self.gen.discard(handles())
        elif op == "foreign":
            call = self.gen.foreign()
        else:
            chaotic = [w for w in self.writers if not w.ordered and not w.dead]
            base = self.gen.append(self.rng.choice(chaotic)) if chaotic else self.gen.foreign()
            call = self.gen.garbage(base)
        return self._send(channel, call)

    def _send(self, channel: Any, call: Call) -> bool:
        """Send one call, check it, update the model; False when the run is over."""
        run = self.run_
        n = run.take_call_number()
        if n is None:
            return False
        with run.lock:
            run.in_flight[self.index] = (call.desc, time.monotonic())
        out = invoke(channel, call)
        with run.lock:
            run.in_flight.pop(self.index, None)
            run.report.by_method[call.method] += 1
            run.report.by_kind[out.kind or out.code] += 1
            secs = run.report.seconds_by_method
            secs[call.method] = secs.get(call.method, 0.0) + out.elapsed_s
            run.recent[self.index].append(f"#{n} {_clip(call.desc, 300)} -> {out.summary()[:200]}")
        self._check(call, out, n)
        self._update(channel, call, out)
        self.calls += 1
        if self.calls % HEALTH_EVERY_CALLS == 0:
            ok, detail = check_health(channel)
            with run.lock:
                run.report.health_checks += 1
            if not ok:
                run.violate(
                    "health",
                    f"{detail} (worker check after call {n})",
                    call.desc,
                    self.index,
                    n,
                    run.context(),
                )
        return not run.stop.is_set() and time.monotonic() < run.deadline

    def _check(self, call: Call, out: Outcome, n: int) -> None:
        run = self.run_
        if run.report.stopped_early or not run.server_alive():
            return  # the server was stalled, killed or died: not this call's doing
        oversize = len(call.request) > run.settings.max_request_bytes
        w = call.writer
        if out.code == "DEADLINE_EXCEEDED" and out.kind is None:
            run.violate(
                "call-bound",
                f"{call.method}: no answer within {CALL_TIMEOUT_S:g}s",
                call.desc,
                self.index,
                n,
                run.context(),
                call.method,
            )
        elif out.code != "OK":
            transport_refusal = oversize and out.code == "RESOURCE_EXHAUSTED" and out.kind is None
            if not transport_refusal and (out.code in ("UNKNOWN", "INTERNAL") or out.kind is None):
                run.violate(
                    "typed-errors",
                    f"{call.method} -> {out.summary()}",
                    call.desc,
                    self.index,
                    n,
                    [],
                    call.method,
                )
        if call.ordered and w is not None and w.clean and out.kind == "call_lost":
            run.violate(
                "call-order",
                f"{call.method} of an ordered writer (every earlier call answered) -> {out.summary()}",
                call.desc,
                self.index,
                n,
                [f"earlier call of this writer: {h}" for h in w.history],
                call.method,
            )

    def _update(self, channel: Any, call: Call, out: Outcome) -> None:
        run = self.run_
        w = call.writer
        if call.method == "CreateWriter" and out.code == "OK" and out.response is not None:
            resp = pb.CreateWriterResponse.FromString(out.response)
            if call.pool is not None and call.pool[3] and self.hoarder is None:
                job, kg, ordered, _ = call.pool
                self.hoarder = Writer(resp.log_id, job, kg, ordered, self.rng.getrandbits(64) or 1)
            elif call.pool is not None and len(self.writers) < WRITERS_PER_WORKER:
                job, kg, ordered, _ = call.pool
                self.writers.append(
                    Writer(resp.log_id, job, kg, ordered, self.rng.getrandbits(64) or 1)
                )
            else:  # created by a bad-argument probe that got through: do not keep it
                extra = Writer(resp.log_id, "", (0, 0), False, 1)
                invoke(channel, self.gen.close(extra), timeout_s=2.0)
            return
        if w is None:
            return
        w.calls += 1
        w.history.append(f"{_clip(call.desc, 300)} -> {out.summary()[:200]}")
        transport_failed = out.kind is None and out.code != "OK"
        if call.ordered:
            w.next_seq += 1
            if transport_failed:
                w.clean = False  # the sidecar may never have seen it: a real gap
        else:
            # a chaotic call: follow the numbers it used so the next ones stay plausible
            used = call.order
            if used is not None and used[1]:
                session, seq = used
                w.next_seq = _c64(max(w.next_seq, seq + 1) if session == w.session else seq + 1)
                w.session = session
        if out.code == "OK" and out.response is not None:
            if call.method == "Append":
                w.boundary = max(w.boundary, pb.AppendResponse.FromString(out.response).sqn)
            elif call.method == "LastAppendedSqn":
                w.boundary = pb.SqnResponse.FromString(out.response).sqn
            elif call.method == "PersistDurably":
                handle = pb.PersistResponse.FromString(out.response).handle
                w.boundary = max(w.boundary, handle.to_sqn)
                if handle.entries:
                    run.add_handle(w.job_id, handle, self.rng)
            elif call.method == "CloseWriter":
                w.dead = w.closed = True
        if out.kind in _DEAD_KINDS:
            w.dead = True
        if out.kind == "log_not_found":
            w.closed = True


class _Monitor(threading.Thread):
    """Health every MONITOR_INTERVAL_S and the server's RSS."""

    def __init__(self, run: _Run) -> None:
        super().__init__(name="wire-fuzz-monitor", daemon=True)
        self.run_ = run
        self.proc = psutil.Process(run.server_pid) if run.server_pid else None
        self.done = threading.Event()
        self.killed = False

    def sample_rss(self) -> int | None:
        if self.proc is None:
            return None
        try:
            return int(self.proc.memory_info().rss)
        except psutil.Error:
            return None

    def run(self) -> None:
        run = self.run_
        channel = run.channel()
        try:
            while not self.done.wait(MONITOR_INTERVAL_S):
                self.tick(channel)
        finally:
            channel.close()

    def tick(self, channel: Any) -> None:
        run = self.run_
        r = run.report
        rss = self.sample_rss()
        if self.proc is not None and rss is None:
            run.violate("health", "the server process is gone", "", context=run.context())
            run.fatal("the server process exited")
            return
        if rss is not None:
            with run.lock:
                r.rss_peak = max(r.rss_peak, rss)
            if rss > r.rss_bound:
                run.violate(
                    "rss",
                    f"server RSS {rss / MiB:.0f} MiB > bound {r.rss_bound / MiB:.0f} MiB "
                    f"(start {r.rss_start / MiB:.0f} + {RSS_IN_FLIGHT_FACTOR} x "
                    f"max_in_flight {run.settings.max_in_flight_bytes / MiB:.0f} + "
                    f"{RSS_SLACK_BYTES / MiB:.0f})",
                    "see context",
                    context=run.context(),
                )
                if rss > r.rss_bound + RUNAWAY_BYTES:
                    run.fatal(f"server RSS ran away ({rss / MiB:.0f} MiB)")
                    if run.on_runaway is not None and not self.killed:
                        self.killed = True
                        run.on_runaway()
                    return
        t0 = time.monotonic()
        ok, detail = check_health(channel)
        took = time.monotonic() - t0
        with run.lock:
            r.health_checks += 1
            if ok:
                r.health_latencies.append(took)
        if ok:
            run.health_failures_in_row = 0
            return
        run.health_failures_in_row += 1
        run.violate("health", f"{detail} (monitor)", "see context", context=run.context())
        if run.health_failures_in_row >= FATAL_HEALTH_FAILURES:
            run.fatal(
                f"server unhealthy for {run.health_failures_in_row} checks in a row "
                f"({detail}): stalled"
            )


# ----------------------------------------------------------------- bystander
class Bystander:
    """A writer of another job; its data must survive the fuzzing byte for byte."""

    def __init__(self, address: str) -> None:
        self.client = ChangelogClient(address, timeout_s=CALL_TIMEOUT_S)
        self.writer = self.client.create_writer(
            job_id=BYSTANDER_JOB, operator_id="op", key_group_range=(0, 7)
        )
        self.expected = self._write(0)
        self.handle = self.writer.persist_durably(after=0).result(timeout=CALL_TIMEOUT_S)
        got = self._read(self.handle)
        if got != sorted(self.expected):
            raise RuntimeError("the bystander does not read back even before the fuzzing")

    def _write(self, round_: int) -> list[tuple[int, bytes]]:
        out = []
        for kg in range(8):
            for i in range(3):
                data = f"bystander-{round_}-{kg}-{i}-".encode() + bytes(range(256)) * (kg * 40 + i)
                self.writer.append(kg, data)
                out.append((kg, data))
        return out

    def _read(self, handle: ChangelogHandle) -> list[tuple[int, bytes]]:
        return sorted((kg, data) for kg, _sqn, data in self.client.read_changes(handle))

    def check(self) -> tuple[bool, str]:
        try:
            got = self._read(self.handle)
            if got != sorted(self.expected):
                return False, f"the first checkpoint reads back different ({len(got)} changes)"
            more = self._write(1)
            handle = self.writer.persist_durably(after=0).result(timeout=CALL_TIMEOUT_S)
            got = self._read(handle)
            if got != sorted(self.expected + more):
                return (
                    False,
                    f"append + persist after the fuzzing reads back different ({len(got)})",
                )
        except Exception as exc:
            return False, f"{type(exc).__name__}: {str(exc)[:300]}"
        n = len(self.expected) + len(more)
        return (
            True,
            f"{n} changes of job {BYSTANDER_JOB!r} read back byte-exact; append+persist work",
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        self.client.close()


# ----------------------------------------------------------------- driver
def run_fuzz(
    address: str,
    *,
    settings: FuzzSettings | None = None,
    duration_s: float = 20.0,
    max_calls: int = 1_000_000,
    seed: int | None = None,
    workers: int = 3,
    server_pid: int | None = None,
    on_runaway: Callable[[], None] | None = None,
    progress_s: float = 5.0,
    log: Callable[[str], None] | None = print,
    ops: Sequence[str] = (),
    ordered_fraction: float = 0.5,
) -> FuzzReport:
    """Fuzz the sidecar at ``address`` for ``duration_s`` (or ``max_calls``); check invariants.

    ``server_pid`` enables the RSS check; ``on_runaway`` is called once if the
    server's RSS runs ``RUNAWAY_BYTES`` past the bound (kill a server you own).
    The server must run with ``settings.server_args()``.
    """
    settings = settings or FuzzSettings()
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    say = log or (lambda _line: None)
    say(f"wire fuzz: seed {seed}, {workers} workers, {duration_s:g}s, server {address}")
    bystander = Bystander(address)
    unknown = set(ops) - {name for name, _ in OPS}
    if unknown:
        raise ValueError(f"unknown ops {sorted(unknown)}; known: {[n for n, _ in OPS]}")
    chosen = [(name, w) for name, w in OPS if not ops or name in ops]
    run = _Run(
        address, settings, seed, 0.0, max_calls, server_pid, on_runaway, chosen, ordered_fraction
    )
    monitor = _Monitor(run)
    r = run.report
    start_rss = monitor.sample_rss()
    if start_rss is not None:
        r.rss_checked = True
        r.rss_start = r.rss_peak = start_rss
        r.rss_bound = start_rss + settings.rss_allowance
    run.started = time.monotonic()
    run.deadline = run.started + duration_s
    threads = [_Worker(run, i) for i in range(workers)]
    monitor.start()
    for t in threads:
        t.start()
    next_progress = run.started + progress_s
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
            if time.monotonic() >= next_progress:
                next_progress += progress_s
                say(_progress(run, monitor))
            # a worker stuck in a call past its deadline (should not happen: every call has one)
            if time.monotonic() > run.deadline + 4 * CALL_TIMEOUT_S:
                run.fatal("workers did not finish within 4 call timeouts of the deadline")
                break
    finally:
        run.stop.set()
        monitor.done.set()
        monitor.join(5)
        r.duration_s = time.monotonic() - run.started
    # After the run: one more health check and RSS sample, then the bystander.
    channel = run.channel()
    try:
        monitor.tick(channel)
    finally:
        channel.close()
    if r.stopped_early:
        r.bystander_detail = f"not checked: the run stopped early ({r.stopped_early})"
    else:
        r.bystander_ok, r.bystander_detail = bystander.check()
    bystander.close()
    say(_progress(run, monitor))
    return r


def _progress(run: _Run, monitor: _Monitor) -> str:
    r = run.report
    with run.lock:
        kinds = ", ".join(f"{k}={v}" for k, v in r.by_kind.most_common(8))
        nviol = sum(r.violation_counts.values())
        calls = r.calls
    rss = monitor.sample_rss()
    rss_text = (
        f"rss {rss / MiB:.0f} MiB (peak {r.rss_peak / MiB:.0f}, bound {r.rss_bound / MiB:.0f})"
        if rss is not None
        else "rss ?"
    )
    t = run.elapsed()
    return (
        f"[{t:6.1f}s] calls {calls} ({calls / max(t, 1e-9):.0f}/s), violations {nviol}, "
        f"{rss_text}; {kinds}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    d = FuzzSettings()
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.wire_fuzz",
        description="Fuzz the dstl sidecar's gRPC API on the wire and check it stays typed, "
        "bounded, healthy, within memory, and harmless to other jobs.",
    )
    parser.add_argument("--duration-s", type=float, default=300.0, help="how long to fuzz")
    parser.add_argument(
        "--max-calls", type=int, default=5_000_000, help="stop after this many calls"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent fuzzing threads")
    parser.add_argument(
        "--address",
        default="",
        help="fuzz this sidecar (host:port) instead of starting one; it must run with the "
        "fuzzer's settings (printed at start)",
    )
    parser.add_argument("--server-pid", type=int, default=None, help="with --address: for RSS")
    parser.add_argument("--dir", default="", help="server root (default: a temporary directory)")
    parser.add_argument("--progress-s", type=float, default=5.0, help="progress line interval")
    parser.add_argument(
        "--ops",
        default="",
        help="comma-separated subset of the operations to run (default all): "
        + ",".join(name for name, _ in OPS),
    )
    parser.add_argument(
        "--ordered-fraction",
        type=float,
        default=0.5,
        help="fraction of writers whose calls carry the right session and seq (default 0.5)",
    )
    parser.add_argument(
        "--max-in-flight-bytes", type=int, default=d.max_in_flight_bytes, help="server setting"
    )
    parser.add_argument(
        "--max-request-bytes", type=int, default=d.max_request_bytes, help="server setting"
    )
    parser.add_argument(
        "--max-change-bytes", type=int, default=d.max_change_bytes, help="server setting"
    )
    ns = parser.parse_args(argv)
    settings = FuzzSettings(
        max_in_flight_bytes=ns.max_in_flight_bytes,
        max_request_bytes=ns.max_request_bytes,
        max_change_bytes=ns.max_change_bytes,
        batch_size_threshold=min(d.batch_size_threshold, ns.max_in_flight_bytes),
    )
    seed = ns.seed if ns.seed is not None else random.SystemRandom().randrange(1 << 32)
    print("server settings: " + " ".join(settings.server_args()), flush=True)

    def go(address: str, pid: int | None, kill: Callable[[], None] | None) -> FuzzReport:
        return run_fuzz(
            address,
            settings=settings,
            duration_s=ns.duration_s,
            max_calls=ns.max_calls,
            seed=seed,
            workers=ns.workers,
            server_pid=pid,
            on_runaway=kill,
            progress_s=ns.progress_s,
            log=lambda line: print(line, flush=True),
            ops=[o for o in ns.ops.split(",") if o],
            ordered_fraction=ns.ordered_fraction,
        )

    if ns.address:
        report = go(ns.address, ns.server_pid, None)
    else:
        from dstl_server.testing import ServerProcess

        with tempfile.TemporaryDirectory(prefix="dstl-fuzz-") as tmp:
            root = Path(ns.dir or tmp) / "srv"
            with ServerProcess(root, extra_args=settings.server_args()) as proc:
                assert proc.proc is not None
                report = go(proc.address, proc.proc.pid, proc.kill)
            tail = (
                proc.stderr_path.read_text(errors="replace")[-1500:]
                if proc.stderr_path.exists()
                else ""
            )
            if not report.passed and tail:
                print("server stderr (tail):\n" + tail)
    print(report.render(), flush=True)
    print(f"seed {seed}: " + ("PASS" if report.passed else "FAIL"), flush=True)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
