"""``Forward`` requests (a child node's flush, as a hostile or broken child sends it).

Valid encoded log sections, sections with a corrupt body or header, empty
and garbage sections, up to a million empty sections, foreign and bad job
ids. Without auth the fuzz server takes a forward from anyone: a valid one
lands in an object of a fuzz job and is answered with its placements.
"""

from __future__ import annotations

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.format import Changeset, encode_log_section, pack_changes
from loadtest.wire_fuzz.calls import Call
from loadtest.wire_fuzz.encoding import describe, tag, varint
from loadtest.wire_fuzz.gen.base import GenBase
from loadtest.wire_fuzz.gen.jobs import BAD_JOB_IDS
from loadtest.wire_fuzz.settings import FUZZ_JOBS

_MODES = (
    ("valid", 20),
    ("corrupt_body", 15),
    ("corrupt_header", 10),
    ("garbage", 10),
    ("empty", 10),
    ("many_empty", 10),
    ("bad_job", 5),
)


class ForwardCalls(GenBase):
    """Forward requests (one worker thread, like every generator)."""

    def section(self) -> bytes:
        """One valid encoded log section of a random writer: a few key groups, SQNs."""
        rng = self.rng
        first = rng.randrange(1 << 20)
        changesets = [
            Changeset(
                first + i,
                {
                    kg: [pack_changes([rng.randbytes(rng.randint(0, 64))])]
                    for kg in rng.sample(range(8), rng.randint(1, 3))
                },
            )
            for i in range(rng.randint(1, 3))
        ]
        sec = encode_log_section(rng.randbytes(16), changesets, first + len(changesets))
        return b"".join(sec.chunks)

    def forward(self) -> Call:
        rng = self.rng
        mode = self.weighted(_MODES)
        job = rng.choice(FUZZ_JOBS)
        sections = [self.section() for _ in range(rng.randint(1, 3))]
        if mode == "corrupt_body" or mode == "corrupt_header":
            i = rng.randrange(len(sections))
            buf = bytearray(sections[i])
            at = len(buf) - 1 - rng.randrange(8) if mode == "corrupt_body" else rng.randrange(40)
            buf[at] ^= 1 << rng.randrange(8)
            sections[i] = bytes(buf)
        elif mode == "garbage":
            sections.append(rng.randbytes(rng.randint(1, 256)))
        elif mode == "empty":
            sections = [b""] if rng.random() < 0.5 else []
        elif mode == "bad_job":
            job = rng.choice(BAD_JOB_IDS)
        msg = pb.ForwardRequest(job_id=job, sections=sections, sender=self.hex32())
        data = msg.SerializeToString()
        desc = f"{describe(msg)} [{mode}]"
        if mode == "many_empty":  # the probe's shape: 2 bytes per empty section
            n = int(self.s.max_request_bytes * rng.uniform(0.2, 0.98)) // 2
            data += (tag(2, 2) + varint(0)) * n
            desc += f" + {n} empty sections"
        return Call("Forward", data, desc)
