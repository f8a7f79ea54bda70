"""Requests of the job-scoped RPCs: ``DiscardObjects`` and ``ListObjects``.

Own, other, traversing, absolute and malformed object keys, page tokens and
job ids; too many keys (up to a million empty ones); huge page sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

from dstl_client.core._pb import dstl_pb2 as pb
from loadtest.wire_fuzz.calls import Call
from loadtest.wire_fuzz.encoding import describe, tag, varint
from loadtest.wire_fuzz.gen.base import GenBase
from loadtest.wire_fuzz.settings import BYSTANDER_JOB, FUZZ_JOBS, U32, KiB

#: job ids no job may have (too long, traversing, absolute, control characters)
BAD_JOB_IDS = ("", "../" + FUZZ_JOBS[0], "a" * 129, "/abs", "job\n", "j\x00b", "\u00e9t\u00e9")

_LIST_MODES = (
    ("own", 30),
    ("next_page", 15),
    ("other_job", 10),
    ("huge_page", 10),
    ("bad_token", 25),
    ("bad_job", 10),
)


class JobCalls(GenBase):
    """DiscardObjects and ListObjects requests (one worker thread, like every generator).

    ``handles`` are ``(job, handle)`` pairs some worker got from a persist
    (their object keys are real objects); ``pages`` are ``(job, token)``
    pairs a ListObjects answer gave as ``next_page_token``.
    """

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
            (
                "own",
                "other",
                "traversal",
                "absolute",
                "too_many",
                "none",
                "empty_key",
                "many_empty_keys",
            )
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
        elif mode == "many_empty_keys":  # the probe's shape: 2 bytes per empty key
            n = int(self.s.max_request_bytes * rng.uniform(0.2, 0.98)) // 2
            msg = pb.DiscardObjectsRequest(job_id=job)
            data = msg.SerializeToString() + (tag(2, 2) + varint(0)) * n
            return Call("DiscardObjects", data, f"{describe(msg)} + {n} empty keys [{mode}]")
        else:
            keys = [""]
        msg = pb.DiscardObjectsRequest(job_id=job, object_keys=keys)
        return Call("DiscardObjects", msg.SerializeToString(), f"{describe(msg)} [{mode}]")

    def list_objects(
        self, handles: Sequence[tuple[str, pb.Handle]], pages: Sequence[tuple[str, str]] = ()
    ) -> Call:
        """One ListObjects page: of a fuzz job (first or next page), of another job,
        with a huge page size, a malformed or foreign page token, or a bad job id."""
        rng = self.rng
        mode = self.weighted(_LIST_MODES)
        job = rng.choice(FUZZ_JOBS)
        page_size = rng.choice((0, 0, 1, 2, 10, 100, 1000))
        token = ""
        if mode == "own":  # the first page, or one starting after a key of the job
            if rng.random() < 0.3:
                token = self._key_of(job, handles)
        elif mode == "next_page":  # a token a ListObjects answer gave
            if pages:
                job, token = rng.choice(pages)
            else:
                token = self._key_of(job, handles)
        elif mode == "other_job":
            other = rng.choice(
                (BYSTANDER_JOB, FUZZ_JOBS[1] if job == FUZZ_JOBS[0] else FUZZ_JOBS[0])
            )
            if rng.random() < 0.5:
                job = other  # another job's listing (allowed without auth)
            else:
                token = self._key_of(other, handles)  # another job's token: refused
        elif mode == "huge_page":
            page_size = rng.choice((1001, 1 << 16, 1 << 24, 1 << 31, U32 - 1, U32, self.u32()))
        elif mode == "bad_token":
            token = self._bad_token(job)
            if rng.random() < 0.3:
                page_size = self.u32()
        else:
            job = rng.choice((*BAD_JOB_IDS, "l" * (64 * KiB)))
            if rng.random() < 0.3:
                token = self.object_key(FUZZ_JOBS[0])
        msg = pb.ListObjectsRequest(job_id=job, page_size=page_size, page_token=token)
        return Call(
            "ListObjects", msg.SerializeToString(), f"{describe(msg)} [{mode}]", listing=job
        )

    def _key_of(self, job: str, handles: Sequence[tuple[str, pb.Handle]]) -> str:
        """A real object key of ``job`` when a handle holds one, else a well-formed one."""
        keys = [e.object_key for j, h in handles if j == job for e in h.entries]
        return self.rng.choice(keys) if keys else self.object_key(job)

    def _bad_token(self, job: str) -> str:
        """A page token that is no key of ``job``'s listing (or not a key at all)."""
        hx = self.hex32()
        return self.rng.choice(
            (
                f"{job}/../{BYSTANDER_JOB}/{hx[:2]}/{hx}.dstl",
                "../" * 8 + "etc/passwd",
                "/etc/passwd",
                f"/{job}/{hx[:2]}/{hx}.dstl",
                job,  # the job id without its slash
                job + "/",  # the bare prefix
                f"{job}//{hx}",
                f"{job}/{hx[:2]}/{hx}.dstl/..",
                f"{job}/\x00",
                "\x00" * 8,
                "\u00e9" * 40,
                " ",
                "k" * 2000,
                f"{job}/" + "k" * (64 * KiB),
                self.object_key(BYSTANDER_JOB),
                self.foreign_log_id(),
            )
        )
