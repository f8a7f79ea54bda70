"""A failed send of appended changes fails the writer (sticky), never a handle missing one.

A real ``dstl-server`` on S3 (SeaweedFS) behind the fault proxy, with a small
memory budget so that a hanging store turns into backpressure quickly:

* overload: an ``Append`` refused with :class:`Backpressure` fails the writer;
  every later call raises :class:`WriterFailed` (the store's recovery does not
  revive it), ``close()`` still works, and a new writer works once the store
  is back;
* store outage: a persist that failed its upload (:class:`UploadFailed`) does
  not fail the writer (the sidecar keeps the changes and the next persist
  uploads them), but a persist whose carried changes were refused does.

Every handle any writer returns holds every change whose ``append`` returned,
over either client transport (unary calls, the Session stream).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client.core.errors import Backpressure, DstlError, UploadFailed, WriterFailed
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.s3fault import FaultProxyProcess
from tests.integration._helpers import poll_until

pytestmark = [pytest.mark.s3, pytest.mark.slow]

KiB = 1 << 10
MiB = 1 << 20
KG_RANGE = (0, 15)
#: a 1 MiB memory budget, short backpressure wait and upload deadline
SETTINGS = (
    "--max-in-flight-bytes", str(MiB),
    "--batch-size-threshold", str(256 * KiB),
    "--preemptive-persist-threshold", str(256 * KiB),
    "--backpressure-timeout-s", "1",
    "--upload-timeout-s", "1",
    "--upload-deadline-s", "2",
    "--hedge-max-delay-ms", "200",
    "--persist-delay-ms", "5",
)  # fmt: skip
#: every store request stalls far longer than the upload deadline
HANG = {"latency": {"rate": 1.0, "dist": "fixed", "ms": 20_000}}


@pytest.fixture
def proxy(weed_s3: SeaweedS3) -> Iterator[FaultProxyProcess]:
    with FaultProxyProcess(weed_s3.endpoint_url, seed=99) as p:
        yield p


def sidecar(root: Path, s3: SeaweedS3, proxy: FaultProxyProcess, prefix: str) -> ServerProcess:
    return ServerProcess(
        root,
        storage=s3.storage_url(prefix),
        extra_args=["--s3-endpoint-url", proxy.url, "--s3-region", s3.region, *SETTINGS],
        env=s3.env(),
    )


class Tracked:
    """A writer and the changes whose ``append`` returned; checks every handle it gives."""

    def __init__(self, client: ChangelogClient, job_id: str) -> None:
        self.client = client
        self.writer: ChangelogWriter = client.create_writer(
            job_id=job_id, operator_id="op", key_group_range=KG_RANGE
        )
        self.returned: list[tuple[int, bytes]] = []

    def append(self, kg: int, data: bytes) -> None:
        self.writer.append(kg, data)
        self.returned.append((kg, data))

    def persist(self) -> ChangelogHandle:
        """Persist everything (after=0) and check the handle holds every returned append."""
        expected = sorted(self.returned)
        handle = self.writer.persist_durably(after=0).result(timeout=15)
        got = sorted((kg, data) for kg, _sqn, data in self.client.read_changes(handle))
        assert got == expected, f"handle holds {len(got)} changes, {len(expected)} were appended"
        return handle


def assert_failed_for_good(w: ChangelogWriter, cause: type[DstlError]) -> None:
    """Every call but close() raises WriterFailed carrying the original error."""
    calls: dict[str, Callable[[], object]] = {
        "append": lambda: w.append(1, b"after the failure"),
        "append_many": lambda: w.append_many([(2, b"after the failure")]),
        "flush": w.flush,
        "last_appended_sqn": w.last_appended_sqn,
        "persist_durably": lambda: w.persist_durably(after=0).result(timeout=15),
        "truncate": lambda: w.truncate(before=0),
    }
    for name, call in calls.items():
        with pytest.raises(WriterFailed) as info:
            call()
        assert isinstance(info.value.cause, cause), (name, info.value.cause)


def wait_for_budget(proc: ServerProcess, timeout_s: float = 15.0) -> None:
    """Until the sidecar holds less than half its budget."""
    poll_until(
        lambda: proc.scrape_metrics()["dstl_unuploaded_bytes"] < MiB // 2,
        "the sidecar released its memory",
        timeout_s=timeout_s,
    )


def fill_budget(client: ChangelogClient, job_id: str) -> ChangelogWriter:
    """Another job's writer appends (one RPC each) until the sidecar pushes back."""
    filler = client.create_writer(job_id=job_id, operator_id="op", key_group_range=KG_RANGE)
    rng = random.Random(3)
    for i in range(40):
        try:
            filler.append(i % 16, rng.randbytes(256 * KiB))
            filler.flush()
        except Backpressure:
            return filler
    raise AssertionError("10 MiB appended against a 1 MiB budget without backpressure")


def check_new_writer_works(client: ChangelogClient, proc: ServerProcess, job_id: str) -> None:
    wait_for_budget(proc)
    fresh = Tracked(client, job_id)
    for kg in range(16):
        fresh.append(kg, f"fresh {kg}".encode() * 100)
    fresh.persist()
    fresh.writer.close()


# --------------------------------------------------------------------------
def test_an_append_refused_under_backpressure_fails_the_writer(
    tmp_path: Path, weed_s3: SeaweedS3, proxy: FaultProxyProcess, s3_prefix: str, transport: str
) -> None:
    with (
        sidecar(tmp_path, weed_s3, proxy, s3_prefix) as proc,
        ChangelogClient(proc.address, batch_bytes=256 * KiB, transport=transport) as client,
    ):
        t = Tracked(client, "overload")
        t.append(0, b"before the outage")
        t.persist()  # warm: the S3 client and its pool exist

        proxy.set_faults(HANG)
        rng = random.Random(1)
        refused: Backpressure | None = None
        for i in range(200):  # 64 KiB each, sent 4 at a time (batch_bytes)
            try:
                t.append(i % 16, rng.randbytes(64 * KiB))
            except Backpressure as exc:
                refused = exc
                break
        assert refused is not None, "12.5 MiB appended against a 1 MiB budget"
        # changes buffered by appends that returned went with the refused batch:
        # the writer cannot promise a complete log any more
        assert_failed_for_good(t.writer, Backpressure)
        assert t.writer.failed is refused

        proxy.set_faults({})  # the store is back: the writer stays failed
        with pytest.raises(WriterFailed):
            t.writer.persist_durably(after=0).result(timeout=15)
        t.writer.close()  # best effort, never WriterFailed
        check_new_writer_works(client, proc, "overload")


def test_a_refused_persist_that_carried_changes_fails_the_writer(
    tmp_path: Path, weed_s3: SeaweedS3, proxy: FaultProxyProcess, s3_prefix: str, transport: str
) -> None:
    with (
        sidecar(tmp_path, weed_s3, proxy, s3_prefix) as proc,
        ChangelogClient(proc.address, transport=transport) as client,
    ):
        t = Tracked(client, "outage")
        t.append(0, b"checkpoint 1")
        t.persist()

        # 1. The upload fails, the sidecar keeps the carried change: not a writer failure.
        proxy.set_faults(HANG)
        t.append(1, b"kept by the sidecar")
        with pytest.raises(UploadFailed):
            t.writer.persist_durably(after=0).result(timeout=15)
        proxy.set_faults({})
        t.append(2, b"after the upload failure")
        t.persist()  # holds the change of the failed persist too

        # 2. The store hangs and the budget is full: the carried change is refused.
        proxy.set_faults(HANG)
        filler = fill_budget(client, "filler")
        t.append(3, b"carried by the refused persist")
        future = t.writer.persist_durably(after=0)
        with pytest.raises(Backpressure):
            future.result(timeout=15)
        assert_failed_for_good(t.writer, Backpressure)
        assert isinstance(t.writer.failed, Backpressure)

        proxy.set_faults({})  # recovery does not revive the writer
        with pytest.raises(WriterFailed):
            t.writer.persist_durably(after=0).result(timeout=15)
        t.writer.close()
        filler.close()
        check_new_writer_works(client, proc, "outage")
