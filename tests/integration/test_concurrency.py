"""Many writer threads of one job through one client against a real ``dstl-server``."""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dstl_client import ChangelogClient, ChangelogHandle
from dstl_client.core.format import parse_object, verify_object
from dstl_server.testing import ServerProcess
from tests.integration._helpers import object_files, read_all

WRITERS = 32
ROUNDS = 5
CHANGES_PER_ROUND = 40
KG_PER_WRITER = 4
JOB = "job-concurrent"


def _change(writer: int, round_: int, i: int) -> bytes:
    return f"w{writer:02d}-r{round_}-c{i:03d}|".encode() * (1 + i % 5)


def test_many_writer_threads_one_client(tmp_path: Path, transport: str) -> None:
    root = tmp_path / "srv"
    with (
        ServerProcess(root, extra_args=["--persist-delay-ms", "50"]) as proc,
        ChangelogClient(proc.address, batch_bytes=2048, transport=transport) as client,
    ):
        start = threading.Barrier(WRITERS)

        def run(n: int) -> tuple[list[ChangelogHandle], dict[int, list[bytes]]]:
            first = n * KG_PER_WRITER
            w = client.create_writer(
                job_id=JOB,
                operator_id=f"op-{n}",
                key_group_range=(first, first + KG_PER_WRITER - 1),
            )
            start.wait(timeout=60)
            appended: dict[int, list[bytes]] = defaultdict(list)
            handles = []
            for r in range(ROUNDS):
                for i in range(CHANGES_PER_ROUND):
                    kg = first + (i * 7 + r) % KG_PER_WRITER
                    data = _change(n, r, i)
                    w.append(kg, data)
                    appended[kg].append(data)
                # No materialization: every checkpoint covers everything so far and
                # reuses the uploads of the earlier ones.
                handles.append(w.persist_durably(after=0).result(timeout=60))
            return handles, appended

        with ThreadPoolExecutor(WRITERS) as pool:
            results = list(pool.map(run, range(WRITERS)))

        persist_calls = WRITERS * ROUNDS
        for handles, appended in results:
            # Each checkpoint extends the previous one: earlier sections are reused.
            for prev, nxt in itertools.pairwise(handles):
                assert nxt.from_sqn == 0 and nxt.to_sqn > prev.to_sqn
                assert nxt.entries[: len(prev.entries)] == prev.entries
            final = handles[-1]
            got: dict[int, list[bytes]] = defaultdict(list)
            last_sqn: dict[int, int] = {}
            for kg, sqn, data in read_all(client, final):
                assert sqn >= last_sqn.get(kg, 0), "changes of a key group out of SQN order"
                last_sqn[kg] = sqn
                got[kg].append(data)
            # Every acknowledged change exactly once, in append order per key group.
            assert got == appended
            # A checkpoint holds exactly the changes appended before it.
            first_round = read_all(client, handles[0])
            assert len(first_round) == CHANGES_PER_ROUND
            assert all(sqn < handles[0].to_sqn for _, sqn, _ in first_round)

        # Batching: all writers of the job on this node share objects, one per flush.
        files = object_files(root)
        sections = 0
        for path in files:
            data = path.read_bytes()
            verify_object(data)
            index = parse_object(data)
            sections += len(index.sections)
        m = proc.scrape_metrics()
        flushes = sum(v for k, v in m.items() if k.startswith("dstl_flushes_total"))
        assert m['dstl_uploads_total{result="ok"}'] == len(files) == flushes
        assert m["dstl_upload_logs_per_object_count"] == len(files)
        assert m["dstl_upload_logs_per_object_sum"] == sections == persist_calls
        assert m["dstl_persist_requests_total"] == persist_calls
        assert len(files) < persist_calls / 4, f"{len(files)} objects for {persist_calls} persists"
        print(
            f"{persist_calls} persists -> {len(files)} objects ({sections / len(files):.1f} logs/object)"
        )


def test_threads_sharing_one_writer(tmp_path: Path, transport: str) -> None:
    """A writer is thread-safe: each thread's changes arrive whole and in its order."""
    threads, per_thread = 8, 300
    with (
        ServerProcess(tmp_path / "srv") as proc,
        ChangelogClient(proc.address, batch_bytes=1024, transport=transport) as client,
    ):
        w = client.create_writer(job_id=JOB, operator_id="shared", key_group_range=(0, threads - 1))
        sqn_points: list[int] = []

        def run(kg: int) -> None:
            for i in range(per_thread):
                w.append(kg, f"{kg}:{i}".encode())
                if i % 100 == 99:
                    sqn_points.append(w.last_appended_sqn())

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(threads)))
        handle = w.persist_durably(after=0).result(timeout=60)
        got: dict[int, list[bytes]] = defaultdict(list)
        for kg, _sqn, data in read_all(client, handle):
            got[kg].append(data)
        assert got == {
            kg: [f"{kg}:{i}".encode() for i in range(per_thread)] for kg in range(threads)
        }
        assert max(sqn_points) <= handle.to_sqn
        w.close()
