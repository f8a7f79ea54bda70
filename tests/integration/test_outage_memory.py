"""The memory rule holds in a store outage with many writers (a real sidecar on SeaweedFS).

Twelve writers of one client each send an 8 MiB append to a sidecar with a
4 MiB budget while its store answers every request with 503 (the fault
proxy). The budget takes one of them; the others must wait without the
sidecar holding them: on a Session stream the sidecar does not read the
next request while its budget cannot take it (HTTP/2 flow control keeps
it on the client), and a unary call that finds no room is refused before
it is decoded (``BudgetFull``) and sent again, one writer of the client at
a time. Before, every refused request was received and decoded in full and
twelve writers resending kept several in memory at once: peak RSS rose
from 86 to 298-502 MiB (stream) and 648 MiB (unary).

The sidecar's peak RSS must stay within the documented memory rule
(docs/sidecar.md, "Memory"; ``dstl_server.memory_rule``) and, once the
store is back, every append whose ``flush`` returned is readable.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dstl_client import ChangelogClient, ChangelogWriter
from dstl_server.memory_rule import memory_needed
from dstl_server.settings import ServerSettings
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.s3fault import FaultProxyProcess
from tests.integration._helpers import poll_until

pytestmark = [pytest.mark.s3, pytest.mark.slow]

MiB = 1 << 20
KG_RANGE = (0, 15)
#: max_in_flight_bytes: far below what the writers send together
LIMIT = 4 * MiB
WRITERS = 12
#: one change of the largest size (max_change_bytes); two make one 8 MiB request
CHANGE = 4 * MiB
PARTS = 2
#: max_request_bytes: one request and its framing (the rule counts one request)
MAX_REQUEST = 9 * MiB
#: how long the outage lasts once every writer is waiting
OUTAGE_S = 3.0


def memory_rule(max_in_flight: int, read_cache: int, max_request: int) -> int:
    """The documented rule (docs/sidecar.md, "Memory"): what the sidecar may hold."""
    settings = ServerSettings(
        max_in_flight_bytes=max_in_flight,
        read_cache_bytes=read_cache,
        max_request_bytes=max_request,
        batch_size_threshold=MiB,
        preemptive_persist_threshold=MiB,
    )
    return memory_needed(settings).total


@pytest.fixture
def proxy(weed_s3: SeaweedS3) -> Iterator[FaultProxyProcess]:
    with FaultProxyProcess(weed_s3.endpoint_url, seed=17) as p:
        yield p


def payload(writer: int, part: int) -> bytes:
    return bytes([writer, part, 0x5A]) * (CHANGE // 3) + bytes(CHANGE % 3)


class PeakRss:
    """Samples a process's RSS every 10 ms in a thread, until stopped."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.NoSuchProcess:
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_many_writers_in_an_outage_stay_within_the_memory_rule_and_lose_nothing(
    tmp_path: Path,
    weed_s3: SeaweedS3,
    proxy: FaultProxyProcess,
    s3_prefix: str,
    transport: str,
) -> None:
    args = (
        "--s3-endpoint-url", proxy.url,
        "--s3-region", weed_s3.region,
        "--max-in-flight-bytes", str(LIMIT),
        "--max-request-bytes", str(MAX_REQUEST),
        "--read-cache-bytes", "0",
        "--batch-size-threshold", str(MiB),
        "--preemptive-persist-threshold", str(MiB),
        "--backpressure-timeout-s", "60",
        "--upload-timeout-s", "5",
        "--upload-deadline-s", "60",
        "--hedge-mode", "off",
    )  # fmt: skip
    rule = memory_rule(LIMIT, 0, MAX_REQUEST)
    with (
        ServerProcess(
            tmp_path, storage=weed_s3.storage_url(s3_prefix), extra_args=args, env=weed_s3.env()
        ) as proc,
        ChangelogClient(
            proc.address, batch_bytes=PARTS * CHANGE + 64, timeout_s=60, transport=transport
        ) as client,
    ):
        writers: list[ChangelogWriter] = [
            client.create_writer(job_id="outage", operator_id=f"op{i}", key_group_range=KG_RANGE)
            for i in range(WRITERS)
        ]
        writers[0].append(0, b"warm")
        writers[0].persist_durably(after=0).result(timeout=30)  # S3 client and pool exist
        assert proc.proc is not None
        rss_before = psutil.Process(proc.proc.pid).memory_info().rss

        proxy.set_faults({"error_503_rate": 1.0})  # the store refuses everything
        flushed = [False] * WRITERS

        def push(i: int) -> None:
            w = writers[i]
            for part in range(PARTS):
                w.append(part, payload(i, part))
            w.flush()  # one 8 MiB request; returns once the sidecar took it
            flushed[i] = True

        with (
            PeakRss(proc.proc.pid) as rss,
            concurrent.futures.ThreadPoolExecutor(WRITERS) as pool,
        ):
            futures = [pool.submit(push, i) for i in range(WRITERS)]
            # the budget took one request; the others wait: unary calls refused and resent
            # (one wait each), or unread behind the client's one Mux stream (it waits once)
            waits = WRITERS - 1 if transport == "unary" else 1
            poll_until(
                lambda: proc.scrape_metrics()["dstl_backpressure_waits_total"] >= waits,
                "writers pushed back by the full budget",
                timeout_s=20,
            )
            time.sleep(OUTAGE_S)  # a while longer: memory must stay within the rule
            m = proc.scrape_metrics()
            assert m["dstl_unuploaded_bytes"] <= LIMIT + PARTS * CHANGE + 4096
            assert sum(flushed) <= 2  # the outage holds the others back
            proxy.set_faults({})  # the store is back
            for f in futures:
                f.result(timeout=60)

        print(
            f"\n[{transport}] sidecar RSS MiB: before {rss_before / MiB:.0f}, "
            f"peak {rss.peak / MiB:.0f}, rule {rule / MiB:.0f}"
        )
        assert rss.peak <= rule, (
            f"peak RSS {rss.peak / MiB:.0f} MiB is over the memory rule {rule / MiB:.0f} MiB"
        )

        assert all(flushed)
        for i, w in enumerate(writers):
            handle = w.persist_durably(after=0).result(timeout=60)
            got = sorted((kg, data) for kg, _sqn, data in client.read_changes(handle))
            expected = [(part, payload(i, part)) for part in range(PARTS)]
            if i == 0:
                expected.append((0, b"warm"))
            assert got == sorted(expected), f"writer {i}"
            assert w.failed is None
        assert proc.scrape_metrics()["dstl_sessions_failed_total"] == 0
