"""``ReadChanges`` requests: real handles (from the workers' persists) or synthetic
ones, with random offsets, lengths, SQN and key-group ranges, foreign,
traversing and absolute object keys, bad format versions, huge key-group
lists, and real handles padded with up to a million empty entries.
"""

from __future__ import annotations

from collections.abc import Sequence

from dstl_client.core._pb import dstl_pb2 as pb
from loadtest.wire_fuzz.calls import Call
from loadtest.wire_fuzz.encoding import c64, describe, tag, varint
from loadtest.wire_fuzz.gen.base import GenBase
from loadtest.wire_fuzz.settings import BYSTANDER_JOB, FUZZ_JOBS, U32, U64, KiB

#: one empty ``HandleEntry`` (field 8 of ``Handle``) on the wire
_EMPTY_ENTRY = tag(8, 2) + varint(0)

_MUTATIONS = (
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
    ("padded_entries", 3),
    ("no_entries", 2),
    ("key_groups", 10),
)


class ReadCalls(GenBase):
    """ReadChanges requests (one worker thread, like every generator).

    ``handles`` are ``(job, handle)`` pairs some worker got from a persist;
    they are copied before they are changed, never changed in place.
    """

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
        # both answer shapes: batched (what the client asks for) and one per message
        req = pb.ReadChangesRequest(batched=rng.random() < 0.5)
        labels: list[str] = []
        n_mut = 0 if rng.random() < 0.15 else rng.randint(1, 3)
        padding = 0
        for _ in range(n_mut):
            m = self.weighted(_MUTATIONS)
            labels.append(m)
            if m == "padded_entries":  # the probe's shape: 2 bytes per empty entry
                padding = int(self.s.max_request_bytes * rng.uniform(0.2, 0.98)) // 2
            else:
                self._mutate(m, job, h, req, other_keys)
        req.handle.CopyFrom(h)
        data = req.SerializeToString()
        desc = f"{describe(req)} [{'+'.join(labels) or 'unchanged'}]"
        if padding:  # the handle once more with the padding: protobuf merges the two
            padded = h.SerializeToString() + _EMPTY_ENTRY * padding
            data += tag(1, 2) + varint(len(padded)) + padded
            desc += f" + {padding} empty entries"
        return Call("ReadChanges", data, desc, streaming=True)

    def _mutate(
        self, m: str, job: str, h: pb.Handle, req: pb.ReadChangesRequest, other_keys: list[str]
    ) -> None:
        """Apply mutation ``m`` to handle ``h`` (of ``job``) or to ``req``."""
        rng = self.rng
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
                    c64(entry.offset + 1),
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
                    c64(entry.length + 1),
                    c64(entry.length * 2),
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
            entry.object_key = self._hostile_key(job, other_keys)
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

    def _hostile_key(self, job: str, other_keys: list[str]) -> str:
        """An object key a handle of ``job`` must not be able to read through."""
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
            choices.append(self.rng.choice(other_keys))
        return self.rng.choice(choices)
