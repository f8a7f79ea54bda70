"""Forwarding tree with real processes: a 3-level chain root <- mid <- leaf.

Three ``dstl-server`` processes share one ``file://`` root. Each node has two
writers of each of two jobs and persists one of them per round, so no node
flushes on "every writer waiting": the leaf flushes after 10 ms and forwards
to the mid node, which flushes after 300 ms and forwards its merged object
up, and the root, whose own persist started its 1.5 s timer, uploads one
object per job holding the sections of all three nodes. Then the mid node
is killed (SIGKILL): the leaf falls back to uploading itself, and every
acknowledged change still reads back.

The same chain on real S3 (SeaweedFS) stores exactly one object per job per
round, each holding one section per node, readable through every sidecar.
And a mid node killed while it holds a forwarded flush, then restarted on the
same address: the leaf's persists are acknowledged all the same (uploaded
directly, every handle naming a stored object), and once its backoff is over
the leaf forwards to the restarted node again.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client.core.format import verify_object
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from tests.integration._helpers import object_files, poll_until, read_all

JOBS = ("job-a", "job-b")
ROUNDS = 2


def node(
    root: Path,
    name: str,
    delay_ms: float,
    storage: str,
    parent: str = "",
    *,
    s3: SeaweedS3 | None = None,
    listen: str = "127.0.0.1:0",
) -> ServerProcess:
    args = ["--persist-delay-ms", str(delay_ms), "--forward-timeout-s", "5"]
    if parent:
        args += ["--parent", parent]
    if s3 is not None:
        args += s3.server_args()
    env = s3.env() if s3 is not None else None
    return ServerProcess(root / name, storage=storage, extra_args=args, env=env, listen=listen)


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


Pending = list[
    tuple[Node, str, concurrent.futures.Future[ChangelogHandle], list[tuple[int, bytes]]]
]


def start_round(nodes: list[Node], tag: str) -> Pending:
    """Every node writes and asks to persist one writer per job at once."""
    pending: Pending = []
    for n in nodes:
        for job, w in n.writers.items():
            want = [(kg, f"{tag}-{n.name}-{job}-{kg}".encode() * 7) for kg in range(4)]
            w.append_many(want)
            pending.append((n, job, w.persist_durably(n.after[job]), want))
    return pending


def round_(nodes: list[Node], tag: str, acked: Acked) -> list[ChangelogHandle]:
    """Every node writes and persists one writer per job at once; returns the handles."""
    return finish_round(start_round(nodes, tag), acked)


def finish_round(pending: Pending, acked: Acked) -> list[ChangelogHandle]:
    """The handles of a started round, in its order, once acknowledged."""
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


@pytest.mark.slow
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


def logs_of(nodes: list[Node]) -> dict[str, set[str]]:
    """Per job, the log ids (hex) of every writer of every node."""
    return {
        job: {n.writers[job].log_id for n in nodes}
        | {w.log_id for n in nodes for w in n.idle if w.job_id == job}
        for job in JOBS
    }


def bucket_objects(s3: SeaweedS3, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix/`` (straight from weed): key (prefix stripped) -> bytes."""
    client = s3.boto3_client()
    try:
        out: dict[str, bytes] = {}
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=s3.bucket, Prefix=prefix + "/"
        ):
            for obj in page.get("Contents", ()):
                body = client.get_object(Bucket=s3.bucket, Key=obj["Key"])["Body"]
                out[obj["Key"][len(prefix) + 1 :]] = body.read()
        return out
    finally:
        client.close()


@pytest.mark.s3
def test_a_chain_on_s3_stores_one_object_per_job_per_round_that_reads_back_everywhere(
    tmp_path: Path, weed_s3: SeaweedS3, s3_prefix: str
) -> None:
    storage = weed_s3.storage_url(s3_prefix)
    with (
        node(tmp_path, "root", 1500, storage, s3=weed_s3) as root,
        node(tmp_path, "mid", 300, storage, root.address, s3=weed_s3) as mid,
        node(tmp_path, "leaf", 10, storage, mid.address, s3=weed_s3) as leaf,
    ):
        nodes = [Node("root", root), Node("mid", mid), Node("leaf", leaf)]
        acked: Acked = []
        round_keys: list[set[str]] = []
        try:
            for r in range(ROUNDS):
                handles = round_(nodes, f"s3-r{r}", acked)
                assert len(handles) == len(nodes) * len(JOBS)  # a writer per job on every node
                # every node forwards: the tree predicts one object per job per round
                for job in JOBS:
                    keys = {k for h in handles if h.job_id == job for k in h.object_keys}
                    assert len(keys) == 1, (r, job, keys)
                    assert next(iter(keys)).startswith(f"{job}/")
                round_keys.append({k for h in handles for k in h.object_keys})
            assert len(set().union(*round_keys)) == ROUNDS * len(JOBS)  # distinct per round

            stored = bucket_objects(weed_s3, s3_prefix)
            assert set(stored) == set().union(*round_keys)  # no other object in the bucket
            logs = logs_of(nodes)
            for key, data in stored.items():
                job = key.split("/", 1)[0]
                ids = {lid.hex() for lid in verify_object(data).sections}
                # one section per node, all of the object's one job
                assert len(ids) == len(nodes) and ids <= logs[job], (key, ids)
            check_all(acked, [n.client for n in nodes])  # byte-exact through every sidecar
            batches = ROUNDS * len(JOBS)
            assert leaf.scrape_metrics()["dstl_forwarded_batches_total"] == batches
            m = mid.scrape_metrics()
            assert m["dstl_forward_received_batches_total"] == batches
            assert m["dstl_forwarded_batches_total"] == batches
            assert root.scrape_metrics()["dstl_forward_received_batches_total"] == batches
        finally:
            for n in nodes:
                n.client.close()
    for name in ("root", "mid", "leaf"):
        assert object_files(tmp_path / name) == []  # nothing went to a local directory


def fallbacks(proc: ServerProcess) -> float:
    return sum(
        v for k, v in proc.scrape_metrics().items() if k.startswith("dstl_forward_fallbacks_total")
    )


def unavailable(proc: ServerProcess) -> float:
    return proc.scrape_metrics().get('dstl_forward_fallbacks_total{reason="unavailable"}', 0.0)


def forwarded(proc: ServerProcess) -> float:
    return proc.scrape_metrics()["dstl_forwarded_batches_total"]


@pytest.mark.slow
def test_a_restarted_parent_takes_forwards_again_and_no_acknowledged_change_is_lost(
    tmp_path: Path,
) -> None:
    shared = (tmp_path / "shared").resolve()
    storage = f"file://{shared}"
    acked: Acked = []

    def assert_handles_name_stored_objects() -> None:
        for h, _want in acked:
            for key in h.object_keys:
                assert (shared / key).is_file(), (h, key)

    # the mid node holds a forwarded flush for a second (its own writers do not
    # persist), so a kill lands while it does
    with (
        node(tmp_path, "root", 100, storage) as root,
        node(tmp_path, "mid", 1000, storage, root.address) as mid,
        node(tmp_path, "leaf", 10, storage, mid.address) as leaf,
    ):
        leafn = Node("leaf", leaf)
        # writers of every job on the mid node that do not persist: its flushes wait
        # for its delay instead of leaving when the leaf's section arrives
        midn = Node("mid", mid)
        root_client = ChangelogClient(root.address)
        try:
            # forwarding works: leaf -> mid -> root
            round_([leafn], "before", acked)
            assert forwarded(leaf) == len(JOBS)
            assert forwarded(mid) == len(JOBS)

            # kill -9 the mid node while it holds the leaf's next flush
            pending = start_round([leafn], "in-flight")
            poll_until(
                lambda: mid.scrape_metrics()["dstl_unuploaded_bytes"] > 0,
                "the mid node holds a forwarded flush",
            )
            mid.kill()
            handles = finish_round(pending, acked)  # acknowledged all the same: uploaded directly
            assert forwarded(leaf) == len(JOBS)
            assert fallbacks(leaf) >= 1
            for h in handles:
                assert len(h.object_keys) == 1
            assert_handles_name_stored_objects()

            # while the parent is down, the leaf keeps uploading itself: skipping the parent
            # during its backoff, then finding it unreachable once the backoff is over
            failed_before = fallbacks(leaf)
            round_([leafn], "down", acked)
            assert fallbacks(leaf) >= failed_before + len(JOBS)
            unreachable = unavailable(leaf)
            down_rounds = iter(range(1000))

            def tried_the_dead_parent() -> bool:
                round_([leafn], f"down-{next(down_rounds)}", acked)
                return unavailable(leaf) > unreachable

            poll_until(tried_the_dead_parent, "the leaf tries the dead parent again", 10, 0.05)
            assert forwarded(leaf) == len(JOBS)
            assert_handles_name_stored_objects()

            # the mid node comes back on the same address: after its backoff (0.5 s
            # doubling, 30 s at most) the leaf forwards to it again
            with node(tmp_path, "mid", 1000, storage, root.address, listen=mid.address) as mid2:
                assert mid2.address == mid.address
                rounds = iter(range(1000))

                def forwards_again() -> bool:
                    round_([leafn], f"after-{next(rounds)}", acked)
                    return forwarded(leaf) > len(JOBS)

                poll_until(forwards_again, "the leaf forwards to the restarted mid node", 30, 0.05)
                assert mid2.scrape_metrics()["dstl_forward_received_batches_total"] >= 1
                assert_handles_name_stored_objects()
                check_all(acked, [leafn.client, root_client])
        finally:
            leafn.client.close()
            midn.client.close()
            root_client.close()
    assert object_files(tmp_path / "leaf") == []  # everything went to the shared root
