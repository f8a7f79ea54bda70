"""Forwarding tree with real processes: a 3-level chain root <- mid <- leaf.

Three ``dstl-server`` processes share one ``file://`` root. Each node has two
writers of each of two jobs and persists one of them per round, so no node
flushes on "every writer waiting": the leaf flushes after 10 ms and forwards
to the mid node, which flushes after 300 ms and forwards its merged object
up, and the root, whose own persist started its 1.5 s timer, uploads one
object per job holding the sections of all three nodes. Then the mid node
is killed (SIGKILL): the leaf falls back to uploading itself, and every
acknowledged change still reads back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client.core.format import verify_object
from dstl_server.testing import ServerProcess
from tests.integration._helpers import object_files, read_all

JOBS = ("job-a", "job-b")
ROUNDS = 2


def node(root: Path, name: str, delay_ms: float, storage: str, parent: str = "") -> ServerProcess:
    args = ["--persist-delay-ms", str(delay_ms), "--forward-timeout-s", "5"]
    if parent:
        args += ["--parent", parent]
    return ServerProcess(root / name, storage=storage, extra_args=args)


class Node:
    """One sidecar's client and, per job, the writer that persists and an idle one."""

    def __init__(self, name: str, proc: ServerProcess) -> None:
        self.name = name
        self.proc = proc
        self.client = ChangelogClient(proc.address)
        self.writers: dict[str, ChangelogWriter] = {}
        self.idle: list[ChangelogWriter] = []
        for job in JOBS:
            self.writers[job] = self.client.create_writer(
                job_id=job, operator_id="op", key_group_range=(0, 3)
            )
            self.idle.append(
                self.client.create_writer(job_id=job, operator_id="op", key_group_range=(0, 3))
            )
        self.after = dict.fromkeys(JOBS, 0)


Acked = list[tuple[ChangelogHandle, list[tuple[int, bytes]]]]


def round_(nodes: list[Node], tag: str, acked: Acked) -> list[ChangelogHandle]:
    """Every node writes and persists one writer per job at once; returns the handles."""
    pending = []
    for n in nodes:
        for job, w in n.writers.items():
            want = [(kg, f"{tag}-{n.name}-{job}-{kg}".encode() * 7) for kg in range(4)]
            w.append_many(want)
            pending.append((n, job, w.persist_durably(n.after[job]), want))
    handles = []
    for n, job, fut, want in pending:
        h = fut.result(timeout=30)
        n.after[job] = h.to_sqn
        acked.append((h, want))
        handles.append(h)
    return handles


def check_all(acked: Acked, clients: list[ChangelogClient]) -> None:
    for h, want in acked:
        for c in clients:
            got = sorted((kg, data) for kg, _sqn, data in read_all(c, h))
            assert got == sorted(want), (h, c.target)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    storage = f"file://{(tmp_path / 'shared').resolve()}"
    with (
        node(tmp_path, "root", 1500, storage) as root,
        node(tmp_path, "mid", 300, storage, root.address) as mid,
        node(tmp_path, "leaf", 10, storage, mid.address) as leaf,
    ):
        yield [root, mid, leaf]


def test_a_chain_merges_every_node_into_one_object_per_job_and_survives_a_dead_parent(
    tmp_path: Path, chain: list[ServerProcess]
) -> None:
    root, mid, leaf = chain
    nodes = [Node("root", root), Node("mid", mid), Node("leaf", leaf)]
    shared = tmp_path / "shared"
    acked: Acked = []
    try:
        for r in range(ROUNDS):
            handles = round_(nodes, f"r{r}", acked)
            # the tree predicts one object per job per round, for three nodes
            for job in JOBS:
                keys = {k for h in handles if h.job_id == job for k in h.object_keys}
                assert len(keys) == 1, (job, keys)
                assert next(iter(keys)).startswith(f"{job}/")
        files = sorted(shared.rglob("*.dstl"))
        assert len(files) == ROUNDS * len(JOBS)
        # one object holds one job's sections only
        logs_of = {
            job: {n.writers[job].log_id for n in nodes} | {w.log_id for n in nodes for w in n.idle}
            for job in JOBS
        }
        for f in files:
            job = f.relative_to(shared).parts[0]
            ids = {lid.hex() for lid in verify_object(f.read_bytes()).sections}
            assert len(ids) == 3 and ids <= logs_of[job], (f, ids)
        check_all(acked, [n.client for n in nodes])  # through every node's sidecar
        m = mid.scrape_metrics()
        assert m["dstl_forwarded_batches_total"] == ROUNDS * len(JOBS)
        assert m["dstl_forward_received_batches_total"] == ROUNDS * len(JOBS)
        assert root.scrape_metrics()["dstl_forward_received_batches_total"] == ROUNDS * len(JOBS)

        # the parent dies: the leaf uploads directly, no acknowledged change is lost
        mid.kill()
        nodes[1].client.close()
        alive = [nodes[0], nodes[2]]
        before = len(list(shared.rglob("*.dstl")))
        handles = round_(alive, "after-kill", acked)
        leaf_keys = {k for h in handles[len(JOBS) :] for k in h.object_keys}
        root_keys = {k for h in handles[: len(JOBS)] for k in h.object_keys}
        assert not leaf_keys & root_keys
        assert len(list(shared.rglob("*.dstl"))) == before + 2 * len(JOBS)
        check_all(acked, [n.client for n in alive])
        fallbacks = {
            k: v for k, v in leaf.scrape_metrics().items() if k.startswith("dstl_forward_fallbacks")
        }
        assert sum(fallbacks.values()) >= len(JOBS), fallbacks
    finally:
        for n in nodes:
            n.client.close()
    assert object_files(tmp_path / "root") == []  # everything went to the shared root
