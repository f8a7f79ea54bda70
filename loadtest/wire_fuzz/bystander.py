"""The ``bystander`` invariant: a writer of another job, untouched by the fuzzing."""

from __future__ import annotations

import contextlib

from dstl_client import ChangelogClient, ChangelogHandle
from loadtest.wire_fuzz.settings import BYSTANDER_JOB, CALL_TIMEOUT_S


class Bystander:
    """A writer of another job; its data must survive the fuzzing byte for byte.

    Written with the real client before the fuzzing (the constructor raises
    if it does not even read back then) and checked after it; used from the
    thread that runs ``run_fuzz`` only.
    """

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
        """(the first checkpoint reads back and a new append + persist works, detail)."""
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
